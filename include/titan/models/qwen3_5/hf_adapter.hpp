// SPDX-License-Identifier: BSD-3-Clause
// Qwen3.5 <-> Hugging Face Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM (transformers' names, as save_pretrained writes
// them). titan keeps apart what HF fuses, so that each tensor splits over heads on its own: a full-attention
// block's q_proj holds per head [query; gate] (titan's wq and wg), a linear block's in_proj_qkv and depthwise
// conv1d hold q, k, v one after the other (titan's wq/wk/wv and conv_q/conv_k/conv_v). The rotated quarter of each
// query/key head (and of the q/k norm weights) is stored in titan's adjacent-pair RoPE order. Norm weights are
// zero-centred on both sides. The routed experts are stacked in titan ((E, F, D) moe.experts.w1) and one tensor per
// expert in HF (mlp.experts.{e}.gate_proj.weight).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "titan/checkpoint/hf.hpp"
#include "titan/models/qwen3_5/args.hpp"

namespace titan::qwen3_5 {

/// The adapter for a model with these arguments. Export refuses a router HF cannot express.
std::shared_ptr<const checkpoint::HfAdapter> hf_adapter(const Qwen35Args& args);
/// The arguments an HF config.json describes (Qwen3_5TextConfig or Qwen3_5MoeTextConfig keys). An MoE config gives
/// HF's router: softmax, top num_experts_per_tok renormalised, a gated shared expert, no expert bias.
Qwen35Args args_from_hf_config(const nlohmann::json& config);

}  // namespace titan::qwen3_5
