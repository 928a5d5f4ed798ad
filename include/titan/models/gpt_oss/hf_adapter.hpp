// SPDX-License-Identifier: BSD-3-Clause
// gpt-oss <-> Hugging Face GptOssForCausalLM (unquantized, as transformers saves it): parameter names,
// config.json, the q/k row permutation (titan rotates adjacent pairs, HF halves: wq/wk rows and biases
// are reordered within each head), and the fused experts. HF keeps each layer's experts in four tensors,
// mlp.experts.gate_up_proj (E, D, 2F) applied as x @ W with the gate in the even columns and the up
// projection in the odd ones, gate_up_proj_bias (E, 2F) alike, down_proj (E, F, D) and down_proj_bias
// (E, D); titan's w1/w3 (E, F, D) are the transposed even/odd columns, w2 (E, D, F) the transposed down_proj.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "titan/checkpoint/hf.hpp"
#include "titan/models/gpt_oss/args.hpp"

namespace titan::gpt_oss {

/// The adapter for a model with these arguments. Export refuses an MoE HF cannot express (shared
/// experts, sigmoid scores, no renormalisation, scores before the experts, route_scale != 1, groups).
std::shared_ptr<const checkpoint::HfAdapter> hf_adapter(const GptOssArgs& args);
/// The arguments an HF config.json describes (GptOssConfig keys; layer_types must alternate sliding and
/// full attention from a sliding first block). An HF model has no expert bias: load_balance_coeff 0.
GptOssArgs args_from_hf_config(const nlohmann::json& config);

}  // namespace titan::gpt_oss
