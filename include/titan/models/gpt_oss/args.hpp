// SPDX-License-Identifier: BSD-3-Clause
// gpt-oss hyper-parameters (torchtitan's GptOssModelArgs) and its flavors: torchtitan's 20b and 120b,
// and a debugmodel small enough for CPU tests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "titan/nn/moe.hpp"

namespace titan::gpt_oss {

/// gpt-oss's MoE: softmax over the experts in fp32, top-4 renormalised (HF's softmax over the four chosen
/// logits), the expert outputs weighted, a router gate and experts with biases, the clamped SwiGLU.
nn::MoEArgs gpt_oss_moe(int64_t num_experts);

struct GptOssArgs {
  /// Model (residual stream) width D.
  int64_t dim = 2880;
  /// Number of transformer blocks L, every one MoE; even blocks attend through the sliding window.
  int64_t n_layers = 24;
  /// Number of query heads H.
  int64_t n_heads = 64;
  /// Number of key/value heads (grouped-query attention).
  int64_t n_kv_heads = 8;
  /// Per-head dimension HD, independent of dim (H * HD need not equal D).
  int64_t head_dim = 64;
  /// Vocabulary size V (rows of the embedding and of the output projection).
  int64_t vocab_size = 201088;
  /// Hidden size of each routed expert (HF intermediate_size).
  int64_t moe_inter_dim = 2880;
  /// RMSNorm epsilon (block norms and final norm).
  double norm_eps = 1e-5;
  /// Keys a query of a sliding-window block sees: itself and sliding_window - 1 before it.
  int64_t sliding_window = 128;
  /// RoPE base.
  double rope_theta = 150000.0;
  /// YaRN context extension factor; 1 = plain RoPE.
  double rope_factor = 32.0;
  /// YaRN: the pre-training context length the extension is relative to.
  int64_t original_seq_len = 4096;
  /// YaRN: pairs turning more often than this over the original context keep their frequency (ntk_beta).
  double beta_fast = 32.0;
  /// YaRN: pairs turning less often than this are fully interpolated (ntk_alpha).
  double beta_slow = 1.0;
  /// YaRN: round the ramp's ends out to whole pairs (HF's default when a config omits it; gpt-oss's is false).
  bool rope_truncate = false;
  /// Longest context the model supports; training.seq_len may not exceed it.
  int64_t max_seq_len = 131072;
  /// The MoE layers' router and experts.
  nn::MoEArgs moe = gpt_oss_moe(32);

  /// Whether block `layer` attends through the sliding window (the even ones, as gpt-oss).
  static bool is_sliding_layer(int64_t layer) { return layer % 2 == 0; }
  /// Throws `[titan::gpt_oss] expected X, got Y. fix` for inconsistent arguments (the MoE's included).
  void validate() const;
};

/// The flavors: "debugmodel", "20b", "120b". Throws naming the flavor and listing the known ones.
GptOssArgs flavor(std::string_view name);
std::vector<std::string> flavor_names();

}  // namespace titan::gpt_oss
