// SPDX-License-Identifier: BSD-3-Clause
// Qwen3 <-> Hugging Face Qwen3ForCausalLM / Qwen3MoeForCausalLM: parameter names, config.json, the
// q/k row permutation (titan rotates adjacent pairs, HF halves: wq/wk rows and the q_norm/k_norm
// weights are reordered within each head), and the routed experts: titan's stacked
// layers.N.moe.experts.w1 (E, F, D) is HF's model.layers.N.mlp.experts.{0..E-1}.gate_proj.weight
// (w3: up_proj, w2: down_proj), as transformers saves them.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "titan/checkpoint/hf.hpp"
#include "titan/models/qwen3/args.hpp"

namespace titan::qwen3 {

/// The adapter for a model with these arguments. Export refuses an MoE HF cannot express (shared
/// experts, sigmoid scores, scores applied before the experts, route_scale != 1, expert groups).
std::shared_ptr<const checkpoint::HfAdapter> hf_adapter(const Qwen3Args& args);
/// The arguments an HF config.json describes (Qwen3Config or Qwen3MoeConfig keys). An MoE config
/// gives HF's router: softmax, top num_experts_per_tok, renormalised when norm_topk_prob, no expert bias.
Qwen3Args args_from_hf_config(const nlohmann::json& config);

}  // namespace titan::qwen3
