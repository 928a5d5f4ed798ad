// SPDX-License-Identifier: BSD-3-Clause
// DeepSeek-V3's ParallelPlan: FSDP/HSDP/DDP units (models/decoder.hpp's: the embeddings, each dense
// block, each MoE block as two units (attention, norms, router and shared experts; then its routed
// experts), norm + output), activation checkpointing of blocks, expert parallelism of the MoE blocks
// and torchtitan's tensor parallelism: MLA's up-projections (wq or wq_b, wkv_b) split over heads, its
// down-projections and their norms (wq_a, q_norm, wkv_a, kv_norm) whole on every tp rank with their
// gradients summed, wo rowwise, dense feed-forwards as Llama's, the MoE on each rank's sequence shard.
// Context and pipeline parallelism for this model are not built or tested yet: cp or pp > 1 is refused.
#pragma once

#include <string>
#include <vector>

#include "titan/models/decoder.hpp"
#include "titan/parallel/plan.hpp"

namespace titan {
struct JobConfig;
}
namespace titan::dist {
class Mesh;
}

namespace titan::deepseek_v3 {

class DeepSeekV3;
struct DeepSeekV3Args;

/// The blocks' shape the shared decoder plans take (models/decoder.hpp): MoE blocks after the dense ones.
models::DecoderShape decoder_shape(const DeepSeekV3Args& args);

/// The plan the job config asks for on mesh (see the file comment); throws naming the axis for cp or
/// pp > 1.
parallel::ParallelPlan parallel_plan(const DeepSeekV3& model, const JobConfig& config, const dist::Mesh& mesh);

}  // namespace titan::deepseek_v3
