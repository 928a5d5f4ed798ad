// SPDX-License-Identifier: BSD-3-Clause
// Training metrics the way torchtitan reports them: tokens/s per device, TFLOPs and MFU from the
// 6N + 12*L*D*S FLOP formula, memory peaks, step/data time; printed as one fixed-field console
// line (with progress and ETA) and handed as one record to its sinks (metrics/sink.hpp):
// <run_dir>/metrics.jsonl, TensorBoard event files (metrics/tensorboard.hpp), a W&B run (metrics/wandb.hpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "titan/core/log.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/metrics/sink.hpp"

namespace titan {

class TensorBoardWriter;

/// Peak dense FLOP/s of a device: the bf16 table for GPUs (torchtitan's, matched on the name), and
/// for CPUs the peak of the threads in use in the dtype the GEMMs run in (threads * FLOP/cycle * clock;
/// bf16_gemms: AVX512-BF16 or AMX where the CPU has them, core/cpu_info.hpp), or `declared` > 0.
struct PeakFlops {
  double flops = 0;         ///< FLOP/s
  std::string description;  ///< how it was determined, for the startup log
};
PeakFlops peak_flops(const at::Device& device, int64_t num_threads, double declared = 0, bool bf16_gemms = false);
/// torchtitan's GPU table lookup by device name (e.g. "NVIDIA H200"); nullopt when unknown.
std::optional<double> gpu_peak_flops(const std::string& device_name);
/// Memory of a GPU by name (e.g. "H100", "NVIDIA H200"), the vendors' figures in GB (1e9 bytes), for
/// the names of the peak table; nullopt when unknown.
std::optional<int64_t> gpu_memory_bytes(const std::string& device_name);
/// "80GB" (1e9), "80GiB" (2^30), "141 GB", "1.5TB", "512MiB" or plain bytes -> bytes. Throws naming
/// `what` (e.g. "--device-memory") otherwise.
int64_t parse_memory_size(std::string_view text, std::string_view what = "memory size");

/// Memory figures in bytes: allocator peaks on CUDA, process RSS on CPU.
struct MemoryStats {
  int64_t max_active = 0;    ///< CUDA: peak active bytes; CPU: peak RSS (VmHWM)
  int64_t max_reserved = 0;  ///< CUDA: peak reserved bytes; CPU: current RSS
  int64_t capacity = 0;      ///< device memory (CUDA) or physical RAM (CPU)
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
};
MemoryStats memory_stats(const at::Device& device);
/// Resets the peaks (CUDA) after each log, as torchtitan does.
void reset_peak_memory(const at::Device& device);

/// One logged step.
struct StepMetrics {
  int64_t step = 0;
  double loss = 0;       ///< global average loss (token-mean)
  double grad_norm = 0;  ///< pre-clip global grad norm
  double lr = 0;
  double tps = 0;           ///< tokens per second per device
  double tflops = 0;        ///< achieved model TFLOP/s per device
  double mfu = 0;           ///< percent of peak
  double step_time = 0;     ///< seconds per step (mean since last log)
  double data_time = 0;     ///< seconds per step spent waiting on data (mean)
  double data_pct = 0;      ///< data_time / step_time in percent
  int64_t tokens_seen = 0;  ///< tokens consumed by this rank so far
  MemoryStats memory;
  /// This rank's memory by part since the last log (when the trainer supplies it; see
  /// MetricsProcessor::Options::memory_parts).
  std::optional<MemoryParts> parts{};
  int64_t total_steps = 0;  ///< steps of the run (0 = unknown: no progress or ETA)
  double eta_seconds = 0;   ///< estimated time to total_steps (see MetricsProcessor::log)
};

/// A rounded duration for the ETA: "45s", "4m05s" (under 10 minutes), "14m", "2h05m", "3d04h".
std::string format_duration(double seconds);
/// The console line's progress field: "step: 120/2000 · ETA 14m", the step right-aligned to the
/// width of total_steps (at least 3); just "step: 120" when total_steps is 0 (unknown).
std::string format_progress(int64_t step, int64_t total_steps, double eta_seconds);

/// Accumulates tokens and times between logs and turns them into StepMetrics.
class MetricsProcessor {
 public:
  struct Options {
    int64_t flops_per_token = 0;         ///< model FLOPs per token (fwd+bwd)
    double peak_flops = 0;               ///< device peak FLOP/s for MFU
    int64_t non_data_parallel_size = 1;  ///< cp * tp * pp: tps is per device
    at::Device device = at::kCPU;
    std::filesystem::path jsonl_path{};  ///< empty = no JSONL
    /// Folder for a TensorBoard event file with the same scalars as the JSONL; empty = none.
    std::filesystem::path tensorboard_folder{};
    /// Steps of the run, for the progress and ETA in the console line; 0 = unknown (none shown).
    int64_t total_steps = 0;
    bool color = log::color();  ///< ANSI colors (default: stdout is a terminal)
    /// This rank's memory by part, asked once per log (it may restart its peaks); empty = none.
    std::function<MemoryParts()> memory_parts{};
  };
  explicit MetricsProcessor(Options options);
  ~MetricsProcessor();
  MetricsProcessor(MetricsProcessor&&) noexcept;
  MetricsProcessor& operator=(MetricsProcessor&&) noexcept;

  /// Adds a destination for every record from now on, beside the JSONL and the event file of the Options
  /// (a W&B run, a user's own).
  void add_sink(std::unique_ptr<MetricsSink> sink);
  /// Called by the loop once per step, before that step's log: tokens read this step and seconds spent
  /// waiting on the data loader. The previous step's records are complete then (sinks are flushed).
  void add_step(int64_t tokens, double data_seconds);
  /// Builds the record for `step` over the steps since the last log, prints and writes it. The ETA
  /// is the mean step time since the first log of this process (step 1's warm-up left out), times
  /// the steps left; at the first log, that log's mean step time.
  StepMetrics log(int64_t step, double loss, double grad_norm, double lr);
  /// A scalar for the next logged record's JSONL and TensorBoard, e.g. "moe/max_load_ratio".
  void add_scalar(const std::string& key, double value);
  /// Prints and writes a validation result: the token-mean loss over `tokens` and its perplexity.
  void log_validation(int64_t step, double loss, int64_t tokens);
  /// Prints `values` under `title` and writes them as one record of `step` (JSONL, TensorBoard, sinks): the
  /// in-training evaluation's metrics ("eval/<task>/<metric>").
  void log_record(int64_t step, std::string_view title, const std::vector<std::pair<std::string, double>>& values);
  /// Console line for a record (fixed fields, optional ANSI colors).
  std::string format_line(const StepMetrics& m) const;
  /// The event file, when Options::tensorboard_folder was given.
  std::optional<std::filesystem::path> tensorboard_file() const;

 private:
  Options options_;
  void write(int64_t step, const nlohmann::json& record);

  std::vector<std::unique_ptr<MetricsSink>> sinks_{};
  TensorBoardWriter* tensorboard_ = nullptr;  // one of sinks_, when Options::tensorboard_folder was given
  std::optional<std::pair<int64_t, std::chrono::steady_clock::time_point>> first_log_{};  // step, time
  std::chrono::steady_clock::time_point last_log_;
  int64_t tokens_since_log_ = 0;
  int64_t steps_since_log_ = 0;
  double data_seconds_since_log_ = 0;
  int64_t tokens_seen_ = 0;
  std::map<std::string, double> scalars_{};  // add_scalar's, written by the next log
};

}  // namespace titan
