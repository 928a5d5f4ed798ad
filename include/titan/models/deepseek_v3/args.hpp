// SPDX-License-Identifier: BSD-3-Clause
// DeepSeek-V3 hyper-parameters (torchtitan's DeepSeekV3ModelArgs) and torchtitan's flavors:
// debugmodel, 16B (DeepSeek-V2-Lite's shape), 236B (DeepSeek-V2's) and 671B (DeepSeek-V3's).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "titan/nn/moe.hpp"

namespace titan::deepseek_v3 {

struct DeepSeekV3Args {
  /// Model (residual stream) width D.
  int64_t dim = 2048;
  /// Number of transformer blocks L.
  int64_t n_layers = 27;
  /// The first n_dense_layers blocks have a dense SwiGLU; the others an MoE layer.
  int64_t n_dense_layers = 1;
  /// Number of attention heads H.
  int64_t n_heads = 16;
  /// Vocabulary size V.
  int64_t vocab_size = 102400;
  /// Hidden size of the dense blocks' SwiGLU.
  int64_t inter_dim = 10944;
  /// Hidden size of each routed expert (and, times num_shared_experts, of the shared experts).
  int64_t moe_inter_dim = 1408;
  /// The MoE layers' routing and experts (torchtitan's MoEArgs).
  nn::MoEArgs moe{};
  /// RMSNorm epsilon of the block and final norms.
  double norm_eps = 1e-5;
  /// Epsilon of the latent norms (q_norm, kv_norm); unset = norm_eps (torchtitan). Hugging Face: 1e-6.
  std::optional<double> latent_norm_eps = std::nullopt;
  /// Rank of the low-rank query projection (wq_a, q_norm, wq_b); 0 = one full-rank wq.
  int64_t q_lora_rank = 0;
  /// Rank of the compressed key/value latent (wkv_a, kv_norm, wkv_b).
  int64_t kv_lora_rank = 512;
  /// Per-head query/key dimensions without RoPE.
  int64_t qk_nope_head_dim = 128;
  /// Per-head query/key dimensions with RoPE (the key's are one head shared by all heads).
  int64_t qk_rope_head_dim = 64;
  /// Per-head value dimensions.
  int64_t v_head_dim = 128;
  /// Longest context the model supports; training.seq_len may not exceed it.
  int64_t max_seq_len = 163840;
  /// RoPE base.
  double rope_theta = 10000.0;
  /// YaRN: the pre-training context length the extension is relative to.
  int64_t original_seq_len = 4096;
  /// YaRN: context extension factor (divisor of the lowest frequencies).
  double rope_factor = 40.0;
  /// YaRN: pairs turning more often than this over original_seq_len keep their frequency.
  double beta_fast = 32.0;
  /// YaRN: pairs turning less often than this are fully interpolated.
  double beta_slow = 1.0;
  /// YaRN: the softmax scale is multiplied by (0.1 * mscale * ln(rope_factor) + 1)^2.
  double mscale = 1.0;
  /// YaRN on or off; unset = torchtitan's rule: on when the model's seq_len exceeds original_seq_len.
  /// Hugging Face checkpoints set it (rope_type yarn applies at every length).
  std::optional<bool> yarn = std::nullopt;
  /// Magnitude of the YaRN rotations (Hugging Face's attention_factor on cos and sin); 1 in torchtitan.
  double yarn_attention_factor = 1.0;
  /// Multi-token prediction depth D (DeepSeek-V3's num_nextn_predict_layers): modules mtp.0 .. mtp.D-1 after the
  /// blocks, the k-th predicting the token k + 1 ahead (models/multi_token_prediction.hpp); 0: none.
  int64_t num_nextn_predict_layers = 0;
  /// Weight lambda of the multi-token prediction loss (Megatron's mtp_loss_scaling_factor): the objective adds
  /// lambda / D * sum_k L_k.
  double mtp_loss_scaling_factor = 0.1;

  /// Query/key head dimension: qk_nope_head_dim + qk_rope_head_dim.
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  /// Whether YaRN applies to a model built for seq_len positions.
  bool uses_yarn(int64_t seq_len) const { return yarn.value_or(seq_len > original_seq_len); }
  /// The factor on the softmax scale 1/sqrt(qk_head_dim): YaRN's mscale squared, or 1.
  double softmax_mscale(int64_t seq_len) const;
};

/// torchtitan's flavor table: "debugmodel", "16B", "236B", "671B". Throws naming the flavor and
/// listing the known ones.
DeepSeekV3Args flavor(std::string_view name);
std::vector<std::string> flavor_names();

}  // namespace titan::deepseek_v3
