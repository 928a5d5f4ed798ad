// SPDX-License-Identifier: BSD-3-Clause
// Qwen3's ParallelPlan: a pipeline split over pp, tensor (+ sequence, loss) parallelism over tp with
// torchtitan's plan for the dense parts (attention with q/k norms, dense feed-forwards, embeddings,
// output; an MoE layer runs each rank's sequence shard through replicated experts), context
// parallelism, activation checkpointing, then FSDP/HSDP/DDP with one unit per dense block and two per
// MoE block (its routed experts apart). Expert parallelism is not part of this plan.
#pragma once

#include "titan/models/decoder.hpp"
#include "titan/parallel/plan.hpp"

namespace titan {
struct JobConfig;
}
namespace titan::dist {
class Mesh;
}

namespace titan::qwen3 {

class Qwen3;
struct Qwen3Args;

/// The blocks' shape for the shared decoder plan pieces (models/decoder.hpp).
models::DecoderShape decoder_shape(const Qwen3Args& args);

/// The plan the job config asks for: parallelism.disable_loss_parallel, enable_async_tensor_parallel,
/// pipeline_parallel_*, context_parallel_*, activation_checkpoint.*, fsdp_reshard_after_forward, and
/// FSDP mixed precision on GPU (training.mixed_precision_param / _reduce; fp32 on CPU).
parallel::ParallelPlan parallel_plan(const Qwen3& model, const JobConfig& config, const dist::Mesh& mesh);

}  // namespace titan::qwen3
