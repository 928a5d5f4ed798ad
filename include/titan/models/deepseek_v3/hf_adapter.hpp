// SPDX-License-Identifier: BSD-3-Clause
// DeepSeek-V3 <-> Hugging Face DeepseekV3ForCausalLM: parameter names, config.json, the routed experts
// (titan stacks them into experts.w1/w2/w3 (E, ...); HF stores mlp.experts.<e>.gate_proj/up_proj/
// down_proj), and the RoPE layout. titan, like torchtitan and DeepSeek's weights, rotates adjacent
// pairs (x[2i], x[2i+1]) of the rope slice; HF's rope_interleave = true (DeepSeek's checkpoints, and
// what titan writes) reads the same layout, so nothing moves; a checkpoint with rope_interleave =
// false rotates halves, and the rope rows of wq / wq_b (per head) and of wkv_a are permuted on import. The
// multi-token prediction depth mtp.K is HF's model.layers.{num_hidden_layers + K} (DeepSeek's layer 61): enorm,
// hnorm, eh_proj, shared_head.norm (titan's mtp.K.norm), its block's weights under a block's names, and copies of the
// shared embedding and head (embed_tokens, shared_head.head) that the export writes and the import does not read.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "titan/checkpoint/hf.hpp"
#include "titan/models/deepseek_v3/args.hpp"

namespace titan::deepseek_v3 {

/// The adapter for a model with these arguments; `yarn`: whether the model applies YaRN (written to
/// config.json as rope_type yarn); `rope_interleave`: the HF checkpoint's RoPE layout.
std::shared_ptr<const checkpoint::HfAdapter> hf_adapter(const DeepSeekV3Args& args, bool yarn,
                                                        bool rope_interleave = true);
/// The arguments an HF config.json describes (DeepseekV3Config keys; rope_parameters or rope_scaling).
/// Routing is sigmoid with the expert output weighted (HF's DeepseekV3 MoE); YaRN is on iff rope_type
/// is yarn, with HF's attention_factor; the latent norms' epsilon is HF's fixed 1e-6. Multi-token prediction stays
/// off (num_nextn_predict_layers 0): transformers writes num_nextn_predict_layers 1 with no such weights; a job that
/// wants the depths (and imports DeepSeek's layer 61) sets model.num_nextn_predict_layers.
DeepSeekV3Args args_from_hf_config(const nlohmann::json& config);

}  // namespace titan::deepseek_v3
