// SPDX-License-Identifier: BSD-3-Clause
// Qwen3.5 (dense) and Qwen3.5-MoE hyper-parameters, as the text_config of the published config.json names them,
// and their flavors: debug models for CPU, and published sizes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "titan/nn/gated_deltanet.hpp"
#include "titan/nn/moe.hpp"

namespace titan::qwen3_5 {

/// Qwen3.5-MoE's router: softmax over the experts in fp32, top-k renormalised, the expert outputs weighted, one
/// shared expert of shared_dim behind a sigmoid gate; aux-loss-free expert-bias balancing when trained by titan.
nn::MoEArgs qwen3_5_moe(int64_t num_experts, int64_t top_k, int64_t shared_dim);

struct Qwen35Args {
  /// Model (residual stream) width D (hidden_size).
  int64_t dim = 1024;
  /// Number of blocks L (num_hidden_layers).
  int64_t n_layers = 24;
  /// Query heads of the full-attention blocks (num_attention_heads).
  int64_t n_heads = 8;
  /// Key/value heads of the full-attention blocks (num_key_value_heads).
  int64_t n_kv_heads = 2;
  /// Per-head dimension of the full-attention blocks, independent of dim (head_dim).
  int64_t head_dim = 256;
  /// Vocabulary size V.
  int64_t vocab_size = 248320;
  /// Hidden size of the dense SwiGLU feed-forward (intermediate_size).
  int64_t hidden_dim = 3584;
  /// RMSNorm epsilon: block norms, final norm, q/k norms and the linear attention's output norm (rms_norm_eps).
  double norm_eps = 1e-6;
  /// RoPE base (rope_parameters.rope_theta).
  double rope_theta = 10000000.0;
  /// The share of each full-attention head RoPE rotates (rope_parameters.partial_rotary_factor).
  double partial_rotary_factor = 0.25;
  /// Longest context the model supports; training.seq_len may not exceed it (max_position_embeddings).
  int64_t max_seq_len = 262144;
  /// Block l attends fully when (l + 1) % full_attention_interval == 0, else through Gated DeltaNet.
  int64_t full_attention_interval = 4;
  /// Each block's kind, "full_attention" or "linear_attention" (HF's layer_types); empty: from the interval.
  std::vector<std::string> layer_types{};
  /// The Gated DeltaNet blocks' sizes (linear_num_key_heads, ...); its norm_eps is norm_eps.
  nn::GatedDeltaNetOptions linear{};
  /// Scale the init std of output projections by depth: 0.02/sqrt(2*(layer+1)) (torchtitan's).
  bool depth_init = true;
  /// Share the embedding matrix with the output projection.
  bool tie_word_embeddings = true;
  /// Every block's feed-forward is an nn::MoE (Qwen3.5-MoE).
  bool moe_enabled = false;
  /// Hidden size of each routed expert (moe_intermediate_size).
  int64_t moe_inter_dim = 512;
  /// The MoE blocks' router, experts and gated shared expert.
  nn::MoEArgs moe = qwen3_5_moe(8, 2, 512);

  /// Whether block `layer` is softmax attention (else Gated DeltaNet).
  bool is_full_attention(int64_t layer) const;
  /// Features of each full-attention head RoPE rotates: head_dim * partial_rotary_factor.
  int64_t rotary_dim() const;
  /// Throws `[titan::qwen3_5] expected X, got Y. fix` for inconsistent arguments.
  void validate() const;
};

/// The dense flavors ("debugmodel", "0.8B", "9B", "27B") and the MoE ones ("debugmodel_moe", "35B-A3B"). Throws
/// naming the flavor and listing the known ones.
Qwen35Args flavor(std::string_view name);
std::vector<std::string> flavor_names();
Qwen35Args moe_flavor(std::string_view name);
std::vector<std::string> moe_flavor_names();

}  // namespace titan::qwen3_5
