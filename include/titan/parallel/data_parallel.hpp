// SPDX-License-Identifier: BSD-3-Clause
// Data parallelism as FSDP2 does it, for any model built from titan's layers: FSDP (dp_shard),
// HSDP (dp_replicate x dp_shard) and DDP (dp_replicate). Parameters are grouped into units (e.g. the
// embeddings, each transformer block, final norm + output, the root); each unit all-gathers its
// parameters in one flat collective before first use, prefetching the next unit, frees them after
// forward if the policy says so and re-gathers them for backward, and reduce-scatters its gradients
// asynchronously as soon as they are complete. DDP is the same machinery with whole parameters and
// an all-reduce per unit (the unit is the bucket).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "titan/core/choices.hpp"

#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace titan::dist {
class Mesh;
}

namespace titan::parallel {

class DataParallel;
struct DataParallelOptions;
namespace detail {
struct DataParallelState;
std::unique_ptr<DataParallel> apply_data_parallel(torch::nn::Module&, const std::vector<std::vector<std::string>>&,
                                                  const dist::Mesh&, const DataParallelOptions&);
}  // namespace detail

/// How FSDP/HSDP/DDP issue their collectives.
enum class DataParallelCollectives {
  auto_,      ///< per_param on CPU, flat on GPU
  flat,       ///< one all-gather / reduce-scatter per unit over a packed buffer: fewest launches, one copy in, one out
  per_param,  ///< one collective per parameter, straight into its gathered storage and out of autograd's gradient
};
TITAN_CHOICES(DataParallelCollectives, {DataParallelCollectives::auto_, "auto"},
              {DataParallelCollectives::flat, "flat"}, {DataParallelCollectives::per_param, "per_param"})

/// FSDP/HSDP/DDP options (torchtitan's parallelism.fsdp_* and training.mixed_precision_*).
struct DataParallelOptions {
  /// always (free each unit after its forward, except the last unit, whose backward comes first),
  /// default (as always, but also keep the unit before the last, the last block: torchtitan before 0.2;
  /// torchtitan 0.2.2's apply_fsdp keeps only norm + output, which is `always`) or
  /// never (keep everything gathered from forward to backward).
  ReshardAfterForward reshard_after_forward = ReshardAfterForward::default_;
  /// dtype of the gathered parameters and of compute (bf16 on GPU; fp32 on CPU).
  at::ScalarType param_dtype = at::kFloat;
  /// dtype gradients are reduced in.
  at::ScalarType reduce_dtype = at::kFloat;
  /// See DataParallelCollectives.
  DataParallelCollectives collectives = DataParallelCollectives::auto_;
  /// Prefetch the next unit's all-gather and leave reduce-scatters in flight (false: every collective
  /// waits where it is issued, the no-overlap ablation of bench_step_throughput --overlap 0).
  bool overlap = true;
  /// Record the collective/compute event trace (tests and debugging).
  bool trace = false;
  /// FQNs of parameters FSDP all-gathers in float8 e4m3 with a tensorwise scale from the whole tensor (tensorwise
  /// float8 Linears' weights, float8::fsdp_float8_weights)
  std::vector<std::string> float8_all_gather{};
  /// With float8_all_gather: all their scales in one amax all-reduce per forward (at its first gather) instead of one
  /// per parameter per gather
  bool float8_precompute_scales = false;
  /// FQNs of parameters left out of every unit (FSDP2's ignored_params): neither sharded nor reduced here, e.g.
  /// expert-parallel experts, whose gradients ExpertParallel::reduce_expert_gradients sums
  std::vector<std::string> ignored_params{};
};

/// One event of the trace: what happened to which unit, in program order.
struct DataParallelEvent {
  enum class Kind { kGatherIssued, kGatherWaited, kUse, kFreed, kReduceIssued, kReduceWaited, kBackwardDone };
  Kind kind = Kind::kUse;  ///< what happened
  int64_t unit = -1;       ///< which unit (-1: none)
};

/// The applied data parallelism of one model on one rank (owned by the parallelize() handle).
class DataParallel {
 public:
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// "FSDP(dp_shard=4)", "HSDP(dp_replicate=2, dp_shard=2)", "DDP(dp_replicate=2)".
  std::string describe() const;
  int64_t num_units() const;
  /// Names of the units, e.g. {"tok_embeddings", "layers.0", ..., "norm+output", "root"}.
  std::vector<std::string> unit_names() const;
  /// Bytes of gathered (unsharded) parameters currently held.
  int64_t gathered_bytes() const;
  /// The trace since the last clear_trace() (empty unless options.trace).
  std::vector<DataParallelEvent> trace() const;
  void clear_trace();
  /// Frees every gathered unit (e.g. after an evaluation forward, before saving memory).
  void reshard();
  /// Recomputes the float8 all-gather scales of every float8_all_gather parameter from its current
  /// shards in one amax all-reduce (torchao's precompute_float8_dynamic_scale_for_fsdp; collective over
  /// dp_shard). With float8_precompute_scales the first gather of each forward does this.
  void precompute_float8_scales();

  /// Machinery (units and their parameters), for parallelize()'s checks.
  const detail::DataParallelState& state() const;

 private:
  friend std::unique_ptr<DataParallel> detail::apply_data_parallel(torch::nn::Module&,
                                                                   const std::vector<std::vector<std::string>>&,
                                                                   const dist::Mesh&, const DataParallelOptions&);
  explicit DataParallel(std::unique_ptr<detail::DataParallelState> state);
  std::unique_ptr<detail::DataParallelState> state_;
};

namespace detail {
/// Checks units and options against model before anything changes (errors name the path).
void validate_data_parallel(const torch::nn::Module& model, const std::vector<std::vector<std::string>>& units,
                            const DataParallelOptions& options);
/// Shards (dp_shard > 1) or replicates (dp_replicate > 1) model's parameters over the mesh's data
/// parallel axes, one unit per entry of `units` (module paths, forward order) plus the root unit of
/// the parameters under none. Each parameter keeps its identity (optimizer and layers hold the same
/// tensor) but its data becomes the local shard: dim 0 split evenly over dp_shard, zero-padded at the
/// end. parallelize() calls it when the mesh has data parallelism.
std::unique_ptr<DataParallel> apply_data_parallel(torch::nn::Module& model,
                                                  const std::vector<std::vector<std::string>>& units,
                                                  const dist::Mesh& mesh, const DataParallelOptions& options);
}  // namespace detail

}  // namespace titan::parallel
