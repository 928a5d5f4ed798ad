// SPDX-License-Identifier: BSD-3-Clause
// Qwen3.5's part of the memory planner (models/memory_model.hpp), registered with its spec: what a Gated DeltaNet
// block keeps for backward (the chunked delta rule's per-chunk states among it, and under context parallelism the
// carry received from the previous cp rank), and a full-attention block's nn::Attention terms plus its output gate.
#pragma once

#include "titan/models/memory_model.hpp"

namespace titan::qwen3_5 {

/// One block's attention on one rank for one microbatch (no document masks): an nn::GatedDeltaNet or an
/// nn::Attention.
models::AttentionMemory attention_memory(const nn::AttentionLayer& layer, const models::ActivationShapes& x);

}  // namespace titan::qwen3_5
