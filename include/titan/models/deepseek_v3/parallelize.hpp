// SPDX-License-Identifier: BSD-3-Clause
// DeepSeek-V3's ParallelPlan: FSDP/HSDP/DDP units (models/decoder.hpp's: the embeddings, each dense
// block, each MoE block as two units (attention, norms, router and shared experts; then its routed
// experts), norm + output) and activation checkpointing of blocks. Tensor, context and pipeline
// parallelism for this model are not built or tested yet: a mesh with tp, cp or pp > 1 is refused.
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

/// The plan the job config asks for on mesh (see the file comment); throws naming the axis for tp,
/// cp or pp > 1.
parallel::ParallelPlan parallel_plan(const DeepSeekV3& model, const JobConfig& config, const dist::Mesh& mesh);

}  // namespace titan::deepseek_v3
