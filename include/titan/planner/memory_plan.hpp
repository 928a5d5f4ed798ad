// SPDX-License-Identifier: BSD-3-Clause
// The memory planner: what one rank of a job holds, by part (parameters, gradients, optimizer state,
// activations, communication buffers), for any registered family (dense or MoE), without allocating
// anything; on GPU the caching allocator's reserved peak and what lives outside it; the step time from a
// cost model (compute plus the communication the layout cannot hide, expert parallelism's all-to-alls
// included); and a search over layouts that fit a number of GPUs. `titan-plan` prints it.
//
// It plans on the job's own plan: parallel::plan of the model's sharding spec and the job's settings, the
// one the Trainer applies, applied by titan::parallelize to the model built on the meta device over a
// planning mesh of the layout's shape (dist::Mesh::virtual_mesh: no process group). Parameters, gradients
// and optimizer state are the shards parallelize leaves; activations, buffers and the step time are
// modelled from the same plan. The trainer's measured figures (core/memory_tracker.hpp) are the same
// parts. What it models and how well: docs/memory_planner.md.
//
//   titan::planner::MemoryPlanner planner(config);  // model.name's family on the meta device: no memory
//   auto plan = planner.plan(config, {.world_size = 512, .device_memory = 80e9});
//   fmt::print("{}", titan::planner::format_plan(plan));
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/memory_tracker.hpp"
#include "titan/dist/mesh.hpp"

namespace titan {
struct JobConfig;
}
namespace titan::models {
class Decoder;
}

namespace titan::planner {

/// What the planner assumes about the machine.
struct PlanOptions {
  /// Devices in the job (0: the product of the config's degrees, with dp_shard -1 counted as 1).
  int64_t world_size = 0;
  /// Memory of one device in bytes (0: no fit check).
  int64_t device_memory = 0;
  /// Peak dense FLOP/s of one device, for the step time (0: no step time).
  double peak_flops = 0;
  /// Fraction of peak the compute reaches on the hardware's FLOPs, recompute included (0: calibrated default).
  double mfu = 0;
  /// GPUs per node: a TP, CP or FSDP group inside one node talks over intra_node_bw, else inter_node_bw.
  int64_t gpus_per_node = 8;
  /// Bytes/s one GPU sends inside a node (H100/H200 NVLink 4: 450 GB/s each way).
  double intra_node_bw = 450e9;
  /// Bytes/s one GPU sends between nodes (400 Gb/s RDMA per GPU).
  double inter_node_bw = 50e9;
  /// A CUDA run: FSDP's mixed precision (training.mixed_precision_*), bf16 autocast on one device,
  /// fused RMSNorm, flat collectives. false: a CPU run (compute in training.dtype), as the CPU tests
  /// measure it.
  bool gpu = true;
};

/// Seconds of one step by cause: what the layout cannot hide (docs/memory_planner.md, "Speed").
struct StepTerms {
  double compute = 0;    ///< model FLOPs at the compute efficiency
  double recompute = 0;  ///< AC's forward again
  double fsdp = 0;       ///< FSDP all-gathers and reduce-scatters (and HSDP's all-reduce) not hidden by compute
  double tp = 0;         ///< TP's all-gathers and reduce-scatters on the critical path
  double cp = 0;         ///< CP's key/value exchange and the wait of Gated DeltaNet's state passing
  double pp = 0;         ///< the schedule's bubble and its point-to-point transfers
  double ep = 0;         ///< expert parallelism's token all-to-alls (dispatch and combine), blocking
  double total() const { return compute + recompute + fsdp + tp + cp + pp + ep; }
};

/// One rank's predicted memory and speed for one layout.
struct MemoryPlan {
  dist::MeshShape mesh{};                  ///< the layout
  std::string ac{};                        ///< activation checkpointing: none, full, selective N, op
  int64_t microbatch = 0;                  ///< sequences per forward (under PP: pipeline_parallel_microbatch_size)
  int64_t microbatches = 0;                ///< forwards per step on a rank (gradient accumulation or PP microbatches)
  int64_t local_batch = 0;                 ///< sequences per dp rank per forward-backward (training.local_batch_size)
  int64_t global_batch = 0;                ///< sequences per step over all dp ranks (training.global_batch_size)
  int64_t in_flight = 1;                   ///< microbatches whose activations the shown rank holds at once (PP)
  int64_t pp_rank = 0;                     ///< the pp rank shown: the one with the largest total
  MemoryParts parts{};                     ///< that rank's bytes by part
  int64_t activations_per_microbatch = 0;  ///< bytes one microbatch keeps for backward on that rank
  int64_t expert_dispatch = 0;    ///< of the activations: one MoE layer's routed tokens and their all-to-all buffers
  int64_t device_memory = 0;      ///< PlanOptions::device_memory
  int64_t reserved = 0;           ///< the caching allocator's reserved peak (torchtitan's logged memory)
  int64_t outside_allocator = 0;  ///< CUDA context and NCCL buffers, which the allocator never sees
  int64_t params = 0;             ///< the whole model's parameters (a LoRA job's adapters included)
  int64_t trainable_params = 0;   ///< of those, the ones that train: params, or a LoRA job's adapters
  double flops_per_step = 0;      ///< model FLOPs of one device per step (6 x active params + attention, per token)
  double compute_efficiency = 0;  ///< the fraction of peak the step time assumed (--mfu or the default)
  StepTerms time{};               ///< the step's seconds by cause
  double step_seconds = 0;        ///< time.total()
  double tokens_per_second = 0;   ///< per device, torchtitan's tps (tokens / (tp x cp x pp) / step)
  /// Bytes the device must hold: the allocator's reserved peak plus what lives outside the allocator.
  /// A job whose tensors fit but whose reserved peak does not runs only by flushing the allocator's
  /// cache and retrying (torchtitan's num_alloc_retries), which costs more than any term here.
  int64_t needed() const { return reserved + outside_allocator; }
  /// True when no device memory was given or needed() fits in it.
  bool fits() const { return device_memory <= 0 || needed() <= device_memory; }
  /// Device memory left over at the allocator's predicted reserved peak.
  int64_t headroom() const { return device_memory - reserved - outside_allocator; }
};

/// What --search varies.
struct SearchOptions {
  /// Devices to fill (required).
  int64_t gpus = 0;
  /// Longest list returned.
  int64_t limit = 20;
  /// Choices kept at the config's values instead of searched: any of dp_shard, tp, pp, cp, ep, ac, microbatch.
  std::vector<std::string> hold{};
};

/// Builds the planned model on the meta device: whole (no modules), or a pipeline rank's part of it (its
/// top-level modules, ModelBuild::modules), as the Trainer builds it.
using MetaBuilder = std::function<std::shared_ptr<models::Decoder>(const std::vector<std::string>& modules)>;

namespace detail {
struct PlannerState;
}

/// Plans jobs on one model. It applies each layout's plan once (a search's layouts share what places the
/// parameters: tp, ep, etp, dp_shard x cp, dp_replicate, the pipeline's stages, float8's all-gather) and keeps
/// what parallelize left, so a search over hundreds of layouts applies a few dozen plans. Not thread-safe.
class MemoryPlanner {
 public:
  /// config.model.name's family and flavor at training.seq_len (models::build_model on the meta device).
  explicit MemoryPlanner(const JobConfig& config);
  /// Any model: `build` makes it (or a pipeline rank's part of it) on the meta device.
  explicit MemoryPlanner(MetaBuilder build);
  ~MemoryPlanner();
  MemoryPlanner(MemoryPlanner&&) noexcept;
  MemoryPlanner& operator=(MemoryPlanner&&) noexcept;

  /// The whole model on the meta device.
  const models::Decoder& model() const;
  /// Plans `config`'s layout (config.model.name's ModelSpec::attention_memory counts the attention). Errors name
  /// the key: degrees that do not multiply to the world size, heads not divisible by tp, seq_len not divisible by
  /// cp, an expert_parallel_degree that does not divide the experts (or a dense model's ep > 1), a batch not
  /// divisible into microbatches, an unknown AC mode or option, and whatever parallel::plan or parallelize refuse.
  MemoryPlan plan(const JobConfig& config, const PlanOptions& options = {});
  /// Every layout of `what.gpus` devices (dp_shard x tp x pp x cp, tp <= 8; for an MoE model every ep dividing
  /// dp_shard x cp and the experts; AC none / selective 2 / op / full, microbatch size) that fits
  /// options.device_memory at the config's global batch, fastest first by predicted tokens/s per device (ties:
  /// more memory left at the reserved peak first). `what.hold` narrows it to the layouts that keep the named
  /// choices as the config has them (an unknown name, or dp_shard held at -1, is an error).
  std::vector<MemoryPlan> search(const JobConfig& config, const PlanOptions& options, const SearchOptions& what);

  /// Machinery (the model, its sharding spec, the applied plans kept), for the planner's own code.
  detail::PlannerState& state() { return *state_; }

 private:
  std::unique_ptr<detail::PlannerState> state_;
};

/// MemoryPlanner(config).plan(config, options).
MemoryPlan plan_memory(const JobConfig& config, const PlanOptions& options = {});
/// MemoryPlanner(config).search(config, options, what).
std::vector<MemoryPlan> search_layouts(const JobConfig& config, const PlanOptions& options, const SearchOptions& what);

/// "1.50 GiB".
std::string format_bytes(int64_t bytes);
/// The plan as the table titan-plan prints.
std::string format_plan(const MemoryPlan& plan);
/// One line per layout, best first, with the largest time terms (why it wins or loses).
std::string format_search(const std::vector<MemoryPlan>& plans);
/// The largest time terms with their shares of the step, e.g. "compute 71%, bubble 18%".
std::string largest_terms(const MemoryPlan& plan);
/// The plan as one JSON object (bytes, seconds, tokens/s), for scripts.
std::string plan_json(const MemoryPlan& plan);
/// The plan's layout as a TOML overlay the trainer loads with --job.config_file: the parallel degrees
/// (expert_parallel_degree included), the batch and the AC mode.
std::string plan_toml(const MemoryPlan& plan);

}  // namespace titan::planner
