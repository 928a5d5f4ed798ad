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

#include "titan/parallel/data_parallel_options.hpp"

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
std::unique_ptr<DataParallel> apply_expert_data_parallel(torch::nn::Module&, const std::vector<std::string>&,
                                                         const dist::Mesh&, const DataParallelOptions&);
}  // namespace detail

/// One event of the trace: what happened to which unit, in program order.
struct DataParallelEvent {
  enum class Kind { kGatherIssued, kGatherWaited, kUse, kFreed, kReduceIssued, kReduceWaited, kBackwardDone };
  Kind kind = Kind::kUse;  ///< what happened
  int64_t unit = -1;       ///< which unit (-1: none)
};

/// One parameter of a unit as this rank holds it.
struct DataParallelParam {
  /// Its name (FQN).
  std::string fqn{};
  /// Elements one all-gather of it lands: the unsharded tensor (a TP or EP shard's whole, under those).
  int64_t gathered_numel = 0;
  /// Elements of this rank's shard, the padding to equal rows included.
  int64_t shard_numel = 0;
  /// Gathered in float8 (options.float8_all_gather on a sharded unit).
  bool float8 = false;
  /// Gets a gradient (and its reduction); false for a frozen one (a LoRA run's base weights).
  bool trained = true;
};

/// One unit as this rank holds it.
struct DataParallelUnit {
  /// "layers.0", "norm+output", "root".
  std::string name{};
  /// Its parameters in gather order.
  std::vector<DataParallelParam> params{};
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
  /// The units in order with their parameters as this rank holds them: what the memory planner reads of an
  /// applied plan (titan-plan parallelizes on the meta device and counts these).
  std::vector<DataParallelUnit> units() const;
  /// Whether each backward's unsharded gradients accumulate until the step's end and are reduced once (under a
  /// pipeline: one reduction for all microbatches) rather than reduced by each backward.
  bool defers_gradient_sync() const;
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
  friend std::unique_ptr<DataParallel> detail::apply_expert_data_parallel(torch::nn::Module&,
                                                                          const std::vector<std::string>&,
                                                                          const dist::Mesh&,
                                                                          const DataParallelOptions&);
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
/// FSDP2 over the mesh's efsdp axis for expert-parallel experts (torchtitan's efsdp mesh): each of `experts`
/// (module paths of GroupedExperts already sharded Shard(0) over ep) is one unit whose parameters are split
/// again on dim 0 over efsdp, all-gathered for the grouped GEMM and reduce-scattered over efsdp (then
/// all-reduced over dp_replicate). Parameters outside `experts` are left alone.
std::unique_ptr<DataParallel> apply_expert_data_parallel(torch::nn::Module& model,
                                                         const std::vector<std::string>& experts,
                                                         const dist::Mesh& mesh, const DataParallelOptions& options);
}  // namespace detail

}  // namespace titan::parallel
