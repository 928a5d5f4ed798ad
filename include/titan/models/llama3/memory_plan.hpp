// SPDX-License-Identifier: BSD-3-Clause
// The memory planner: what one rank of a Llama 3 job holds, by part (parameters, gradients, optimizer
// state, activations, communication buffers), from the model built on the meta device and the job's
// layout, without allocating anything; FLOPs per step and the step time at a stated MFU; and a search
// over layouts that fit a number of GPUs. `titan-plan` prints it; the trainer's measured figures
// (core/memory_tracker.hpp) are the same parts. What it models and how well: docs/memory_planner.md.
//
//   auto model = titan::llama3::Llama3::build(config);                 // meta: no memory
//   auto plan = titan::llama3::plan_memory(*model, config, {.world_size = 512, .device_memory = 80e9});
//   fmt::print("{}", titan::llama3::format_plan(plan));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "titan/core/memory_tracker.hpp"
#include "titan/dist/mesh.hpp"

namespace titan {
struct JobConfig;
}

namespace titan::llama3 {

class Llama3;

/// What the planner assumes about the machine.
struct PlanOptions {
  /// Devices in the job (0: the product of the config's degrees, with dp_shard -1 counted as 1).
  int64_t world_size = 0;
  /// Memory of one device in bytes (0: no fit check).
  int64_t device_memory = 0;
  /// Peak dense FLOP/s of one device, for the step time (0: no step time).
  double peak_flops = 0;
  /// Model FLOPs utilisation the step time assumes (0.4 = 40%).
  double mfu = 0.4;
  /// A CUDA run: FSDP's mixed precision (training.mixed_precision_*), bf16 autocast on one device,
  /// fused RMSNorm, flat collectives. false: a CPU run (compute in training.dtype), as the CPU tests
  /// measure it.
  bool gpu = true;
};

/// One rank's predicted memory and speed for one layout.
struct MemoryPlan {
  dist::MeshShape mesh{};                  ///< the layout
  std::string ac{};                        ///< activation checkpointing: none, full, selective N, op
  int64_t microbatch = 0;                  ///< sequences per forward (under PP: pipeline_parallel_microbatch_size)
  int64_t microbatches = 0;                ///< forwards per step on a rank (gradient accumulation or PP microbatches)
  int64_t in_flight = 1;                   ///< microbatches whose activations the shown rank holds at once (PP)
  int64_t pp_rank = 0;                     ///< the pp rank shown: the one with the largest total
  MemoryParts parts{};                     ///< that rank's bytes by part
  int64_t activations_per_microbatch = 0;  ///< bytes one microbatch keeps for backward on that rank
  int64_t device_memory = 0;               ///< PlanOptions::device_memory
  double flops_per_step = 0;               ///< model FLOPs (6N + 12LDS per token) of one device per step
  double step_seconds = 0;                 ///< at the assumed MFU, slowed by recompute and the pipeline bubble
  double tokens_per_second = 0;            ///< per device
  /// True when no device memory was given or the total fits in it.
  bool fits() const { return device_memory <= 0 || parts.total() <= device_memory; }
};

/// Plans `config`'s layout for `model` (built on any device; only shapes are read). Errors name the
/// key: degrees that do not multiply to the world size, heads not divisible by tp, seq_len not
/// divisible by cp, a batch not divisible into microbatches, an unknown AC mode or option.
MemoryPlan plan_memory(const Llama3& model, const JobConfig& config, const PlanOptions& options = {});

/// What --search varies.
struct SearchOptions {
  /// Devices to fill (required).
  int64_t gpus = 0;
  /// Longest list returned.
  int64_t limit = 20;
};

/// Every layout of `search.gpus` devices (dp_shard x tp x pp x cp, tp <= 8, AC none / selective 2 /
/// op / full, microbatch size) that fits options.device_memory at the config's global batch, best
/// first by estimated tokens/s per device (ties: less memory first).
std::vector<MemoryPlan> search_layouts(const Llama3& model, const JobConfig& config, const PlanOptions& options,
                                       const SearchOptions& search);

/// "1.50 GiB".
std::string format_bytes(int64_t bytes);
/// The plan as the table titan-plan prints.
std::string format_plan(const MemoryPlan& plan);
/// One line per layout, best first.
std::string format_search(const std::vector<MemoryPlan>& plans);

}  // namespace titan::llama3
