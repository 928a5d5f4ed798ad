// SPDX-License-Identifier: BSD-3-Clause
// Llama 3's ParallelPlan, torchtitan's: a pipeline split over pp, tensor (+ sequence, loss) parallelism over tp with
// torchtitan's apply_tp plan, then FSDP/HSDP/DDP whose units are the embeddings, each transformer
// block, and final norm + output together (the root holds what is left).
#pragma once

#include <string>
#include <vector>

#include "titan/parallel/plan.hpp"

namespace titan {
struct JobConfig;
struct ParallelismConfig;
struct ActivationCheckpointConfig;
}  // namespace titan
namespace titan::dist {
class Mesh;
}

namespace titan::llama3 {

class Llama3;
struct Llama3Args;

/// torchtitan's TP switches.
struct TensorParallelOptions {
  /// Keep activations sequence-sharded between blocks (norms SequenceParallel).
  bool sequence_parallel = true;
  /// Leave the logits vocab-sharded and compute the loss on the shards.
  bool loss_parallel = true;
};

/// Module paths of each data-parallel unit, in forward order.
std::vector<std::vector<std::string>> data_parallel_units(const Llama3& model);

/// torchtitan's TP plan (see docs/tensor_parallel.md): attention wq/wk/wv and feed-forward w1/w3
/// colwise, wo and w2 rowwise, embedding vocab-parallel, output colwise (vocab-sharded logits under
/// loss parallel), norms sequence-parallel. Checks that `degree` divides the heads and kv heads.
parallel::TensorParallelPlan tensor_parallel_plan(const Llama3& model, int64_t degree,
                                                  const TensorParallelOptions& options = {});

/// The pipeline split for pp ranks from the parallelism.pipeline_parallel_* keys (models::pipeline_plan):
/// torchtitan's (the embeddings count as first_stage_less_layers layers, norm + output as
/// last_stage_less_layers), or with pipeline_parallel_split = flops stages of near-equal training FLOPs
/// at seq_len tokens per sequence (required then); or module_fqns_per_model_part verbatim.
parallel::PipelinePlan pipeline_plan(const Llama3Args& args, int64_t pp, const ParallelismConfig& parallelism,
                                     int64_t seq_len = 0);

/// Context parallelism from the parallelism.context_parallel_* keys: every block's attention attends
/// across the cp split (headtail load balancing unless the balancer is None; allgather or alltoall).
parallel::ContextParallelPlan context_parallel_plan(const Llama3Args& args, const ParallelismConfig& parallelism);

/// Activation checkpointing from the activation_checkpoint.* keys (torchtitan's): none; full (every
/// block); selective with selective_ac_option = N (blocks N, 2N, ... counting from 1), or op (every
/// block per operator: matmul and attention outputs kept as torchtitan's policy says, the rest
/// recomputed; per_op_sac_force_recompute_mm_shapes_by_fqns become the plan's force_recompute_mm,
/// except torchtitan's default "moe.router.gate", which names nothing in a dense Llama). Errors name
/// the key for memory_budget and for an option that is neither an integer >= 1 nor op.
parallel::ActivationCheckpointPlan activation_checkpoint_plan(const Llama3Args& args,
                                                              const ActivationCheckpointConfig& ac);

/// The whole plan on mesh with titan's defaults: TP (sequence and loss parallel) when tp > 1, CP
/// (headtail, allgather) when cp > 1, and FSDP/HSDP/DDP units, fp32 throughout.
parallel::ParallelPlan parallel_plan(const Llama3& model, const dist::Mesh& mesh);

/// The plan the job config asks for: parallelism.disable_loss_parallel,
/// enable_async_tensor_parallel, fsdp_reshard_after_forward, and FSDP mixed precision on GPU
/// (training.mixed_precision_param / _reduce; fp32 on CPU).
parallel::ParallelPlan parallel_plan(const Llama3& model, const JobConfig& config, const dist::Mesh& mesh);

}  // namespace titan::llama3
