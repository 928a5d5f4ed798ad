// SPDX-License-Identifier: BSD-3-Clause
// Qwen3 (dense) and Qwen3-MoE hyper-parameters and torchtitan 0.2.2's named flavors (debugmodel,
// debugmodel_moe, 0.6B ... 32B, 30B-A3B, 235B-A22B).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "titan/nn/moe.hpp"

namespace titan::qwen3 {

struct Qwen3Args {
  /// Model (residual stream) width D.
  int64_t dim = 1024;
  /// Number of transformer blocks L.
  int64_t n_layers = 28;
  /// Number of query heads H.
  int64_t n_heads = 16;
  /// Number of key/value heads (grouped-query attention).
  int64_t n_kv_heads = 8;
  /// Vocabulary size V (rows of the embedding and of the output projection).
  int64_t vocab_size = 151936;
  /// Per-head dimension HD, independent of dim (H * HD need not equal D).
  int64_t head_dim = 128;
  /// Hidden size of the dense SwiGLU feed-forward (HF intermediate_size).
  int64_t hidden_dim = 3072;
  /// RMSNorm epsilon (block norms, final norm and the q/k norms).
  double norm_eps = 1e-6;
  /// RoPE base (no Llama 3.1 frequency scaling).
  double rope_theta = 1000000.0;
  /// RMSNorm every query and key head before RoPE.
  bool qk_norm = true;
  /// Longest context the model supports; training.seq_len may not exceed it.
  int64_t max_seq_len = 4096;
  /// Scale the init std of output projections by depth: 0.02/sqrt(2*(layer+1)).
  bool depth_init = true;
  /// Share the embedding matrix with the output projection (torchtitan's enable_weight_tying).
  bool tie_word_embeddings = false;
  /// Feed-forward of the MoE layers is an nn::MoE (Qwen3-MoE).
  bool moe_enabled = false;
  /// Hidden size of each routed expert (HF moe_intermediate_size).
  int64_t moe_inter_dim = 768;
  /// The MoE layers' router and experts.
  nn::MoEArgs moe{};
  /// With moe_enabled, layer l is MoE when (l + 1) % decoder_sparse_step == 0 (HF's; torchtitan: 1).
  int64_t decoder_sparse_step = 1;
  /// With moe_enabled, these layers stay dense (HF's mlp_only_layers; torchtitan: none).
  std::vector<int64_t> mlp_only_layers{};

  /// Whether block `layer` holds an nn::MoE (else a dense nn::FeedForward of hidden_dim).
  bool is_moe_layer(int64_t layer) const;
  /// Throws `[titan::qwen3] expected X, got Y. fix` for inconsistent arguments (the MoE's included).
  void validate() const;
};

/// torchtitan's flavor table: "debugmodel", "debugmodel_moe", "0.6B", "1.7B", "4B", "8B", "14B",
/// "32B", "30B-A3B", "235B-A22B". Throws naming the flavor and listing the known ones.
Qwen3Args flavor(std::string_view name);
std::vector<std::string> flavor_names();

}  // namespace titan::qwen3
