// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/training_metrics.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>

#include "titan/core/config.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/core/log.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/metrics/tensorboard.hpp"
#include "titan/metrics/wandb.hpp"
#include "titan/nn/bf16_gemm.hpp"
#include "titan/train/rank_model.hpp"
#include "titan/train/run_context.hpp"
#include "titan/train/run_state.hpp"

namespace titan {
namespace {

// torchtitan's folder for a run's TensorBoard and W&B files, <dump>/<save_tb_folder>/<YYYYmmdd-HHMM>[/rank_<r>]:
// rank 0 writes, or with metrics.save_for_all_ranks every rank below one timestamp (the latest clock, agreed by
// all ranks). Empty where this rank writes neither.
std::filesystem::path metrics_folder_of(const RunContext& run) {
  const MetricsConfig& metrics = run.config().metrics;
  if (!metrics.enable_tensorboard && !metrics.enable_wandb) return {};
  std::time_t start = std::time(nullptr);
  if (metrics.save_for_all_ranks)
    start = static_cast<std::time_t>(run.all_reduce_max(static_cast<double>(start), "world"));
  if (!metrics.save_for_all_ranks && run.mesh().rank() != 0) return {};
  return tensorboard_folder(run.config().job.dump_folder, metrics.save_tb_folder, start,
                            metrics.save_for_all_ranks ? std::optional<int64_t>(run.mesh().rank()) : std::nullopt);
}

// The W&B run of this rank (metrics.enable_wandb), in `folder` as torchtitan's WandBLogger starts it, or below
// WANDB_DIR (per rank under save_for_all_ranks) where that is set. W&B's variables are read on every rank, so a
// bad WANDB_MODE stops them all; under save_for_all_ranks a WANDB_RUN_ID gets the rank appended.
std::unique_ptr<WandbWriter> wandb_run_of(const RunContext& run, const std::filesystem::path& folder) {
  const JobConfig& c = run.config();
  if (!c.metrics.enable_wandb) return nullptr;
  std::optional<WandbRun> wandb = wandb_run_from_env();
  const int64_t rank = run.mesh().rank();
  if (!wandb) {
    if (rank == 0) log::info("W&B: WANDB_MODE=disabled, no run written");
    return nullptr;
  }
  if (folder.empty()) return nullptr;
  std::filesystem::path dir = folder;
  if (!wandb->dir.empty()) {
    dir = wandb->dir;
    if (c.metrics.save_for_all_ranks) dir /= fmt::format("rank_{}", rank);
  }
  if (c.metrics.save_for_all_ranks && !wandb->id.empty()) wandb->id += fmt::format("-rank{}", rank);
  auto writer = std::make_unique<WandbWriter>(dir, std::move(*wandb), to_json(c));
  log::info("W&B run {} written offline to {}; upload it with `wandb sync {}`", writer->run().id,
            writer->folder().string(), writer->folder().string());
  return writer;
}

}  // namespace

MetricsProcessor training_metrics(const RunContext& run, const ModelCounts& counts,
                                  std::function<MemoryParts()> memory_parts) {
  const JobConfig& c = run.config();
  const dist::Mesh& mesh = run.mesh();
  const bool bf16 = runs_bf16_gemms(run.config(), run.device());
  const PeakFlops peak = peak_flops(run.device(), at::get_num_threads(), c.metrics.peak_flops,
                                    bf16 && nn::bf16_gemms_at_bf16_rate(run.device()));
  log::info("Peak {}", peak.description);
  const std::filesystem::path folder = metrics_folder_of(run);
  MetricsProcessor metrics({
      .flops_per_token = counts.flops_per_token,
      .peak_flops = peak.flops,
      // torchtitan's per-device tps: a batch is shared by the cp * tp * pp ranks that process it.
      .non_data_parallel_size = mesh.size("tp") * mesh.size("cp") * mesh.size("pp"),
      .device = run.device(),
      .jsonl_path =
          c.metrics.enable_jsonl && mesh.rank() == 0 ? run.run_folder() / "metrics.jsonl" : std::filesystem::path(),
      .tensorboard_folder = c.metrics.enable_tensorboard ? folder : std::filesystem::path(),
      .total_steps = c.training.steps,
      .color = log::color(),
      .memory_parts = std::move(memory_parts),
  });
  if (const auto events = metrics.tensorboard_file()) log::info("TensorBoard events in {}", events->string());
  if (auto wandb = wandb_run_of(run, folder)) metrics.add_sink(std::move(wandb));
  return metrics;
}

bool is_log_step(const JobConfig& config, int64_t step) {
  return step == 1 || step % config.metrics.log_freq == 0 || step == config.training.steps;
}

}  // namespace titan
