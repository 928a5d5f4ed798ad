// SPDX-License-Identifier: BSD-3-Clause
// The planner: one function from what a model declares (its ShardingSpec) and what a job asks for (the
// parallelism, activation-checkpoint and precision settings, the mesh's shape) to the ParallelPlan that
// titan::parallelize applies. The Trainer, a loop of your own and titan-plan all call it, so a parallel
// feature is taught here once.
//
//   const parallel::ParallelPlan plan = parallel::plan(model->sharding_spec(), {
//       .parallelism = config.parallelism, .activation_checkpoint = config.activation_checkpoint}, mesh.shape());
//   auto parallel = titan::parallelize(*model, mesh, plan);
//
// A hand-written ParallelPlan still goes straight to titan::parallelize.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "titan/core/config.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/parallel/plan.hpp"
#include "titan/parallel/sharding_spec.hpp"

namespace torch::nn {
class Module;
}

namespace titan::parallel {

/// The dtypes data parallelism gathers and reduces in, and float8's all-gather.
struct PrecisionPolicy {
  /// dtype of the gathered parameters and of compute (FSDP's mixed precision).
  at::ScalarType param_dtype = at::kFloat;
  /// dtype gradients are reduced in.
  at::ScalarType reduce_dtype = at::kFloat;
  /// FQNs of weights gathered in float8 (tensorwise float8 Linears' weights, float8::fsdp_float8_weights).
  std::vector<std::string> float8_all_gather{};
  /// With float8_all_gather: every scale in one amax all-reduce per forward.
  bool float8_precompute_scales = false;
};

/// What a job asks of the planner besides the mesh.
struct PlanOptions {
  /// parallelism.*: schedules, splits, loss and async TP, reshard policy, CP methods (the degrees are the mesh's).
  ParallelismConfig parallelism{};
  /// activation_checkpoint.* (none unless asked: the job config's own default is selective every 2nd block)
  ActivationCheckpointConfig activation_checkpoint{.mode = AcMode::none};
  /// FSDP's dtypes and float8 all-gather.
  PrecisionPolicy precision{};
};

/// The plan for `spec` on a mesh of `mesh`'s shape: the pipeline split when pp > 1, TP (sequence parallel where the
/// spec allows it, loss parallel unless disabled) when tp > 1, CP when cp > 1, EP when the model has MoE layers and ep
/// or etp > 1, activation checkpointing, FSDP/HSDP/DDP units and options. Refuses an axis the spec refuses (quoting its
/// reason), a tp that does not divide the spec's counts, and a FLOPs split without the spec's costs.
ParallelPlan plan(const ShardingSpec& spec, const PlanOptions& options, const dist::MeshShape& mesh);

/// The options a job config asks for: its parallelism and activation_checkpoint sections and the precision of
/// training.mixed_precision_* (bf16 by default on GPU, fp32 on CPU) and float8.* (all-gather of the float8
/// Linears of `model`, converted before this).
PlanOptions plan_options(const JobConfig& config, const torch::nn::Module& model, bool cuda);

// ---- the planner's pieces, each usable alone ----------------------------------------------------------------

/// The tensor-parallel plan of spec's roles at `degree` (docs/tensor_parallel.md has the role -> style table):
/// between blocks activations are sequence-sharded (sequence_parallel) or replicated; `loss_parallel` keeps the
/// head's logits vocab-sharded; `sharded_experts` (etp = tp) leaves the routed experts to expert parallelism
/// and keeps each MoE layer's `replicated` parts whole. Then the spec's own styles.
TensorParallelPlan tensor_parallel_plan(const ShardingSpec& spec, int64_t degree, bool sequence_parallel,
                                        bool loss_parallel, bool sharded_experts = false);

/// The pipeline split over pp ranks from the parallelism.pipeline_parallel_* keys: stages per rank from the
/// schedule or layers_per_stage; with pipeline_parallel_split = layers torchtitan's cut (the input modules count
/// as first_stage_less_layers layers, the output modules as last_stage_less_layers), with flops stages of
/// near-equal `costs` (required then); or module_fqns_per_model_part verbatim.
PipelinePlan pipeline_plan(const PipelineSplit& split, const PipelineModuleCosts& costs, int64_t pp,
                           const ParallelismConfig& parallelism, const std::string& model = "model");

/// Context parallelism over `attention` from the parallelism.context_parallel_* keys.
ContextParallelPlan context_parallel_plan(const std::vector<std::string>& attention,
                                          const ParallelismConfig& parallelism);

/// Activation checkpointing of `blocks` from the activation_checkpoint.* keys (torchtitan's): none; full; selective
/// N (blocks N, 2N, ... counting from 1) or op. Under op, per_op_sac_force_recompute_mm_shapes_by_fqns become
/// force_recompute_mm, but torchtitan's default "moe.router.gate" only when `has_moe`. Errors name the key.
ActivationCheckpointPlan activation_checkpoint_plan(const std::vector<std::string>& blocks,
                                                    const ActivationCheckpointConfig& ac, bool has_moe,
                                                    const std::string& model = "model");

/// Expert parallelism of `moe` when ep or etp > 1 (experts computing in `compute_dtype`); empty otherwise.
ExpertParallelPlan expert_parallel_plan(const std::vector<MoeModule>& moe, int64_t ep, int64_t etp,
                                        at::ScalarType compute_dtype);

/// FSDP/HSDP/DDP options: fsdp_reshard_after_forward (never under PP by default, as torchtitan) and `precision`.
DataParallelOptions data_parallel_options(const ParallelismConfig& parallelism, const PrecisionPolicy& precision,
                                          int64_t pp);

}  // namespace titan::parallel
