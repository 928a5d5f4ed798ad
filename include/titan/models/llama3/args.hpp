// SPDX-License-Identifier: BSD-3-Clause
// Llama 3 / 3.1 / 3.2 hyper-parameters and torchtitan's named flavors (debugmodel ... 405B).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace titan::llama3 {

struct Llama3Args {
  /// Model (residual stream) width D.
  int64_t dim = 4096;
  /// Number of transformer blocks L.
  int64_t n_layers = 32;
  /// Number of query heads H.
  int64_t n_heads = 32;
  /// Number of key/value heads (grouped-query attention); unset = n_heads.
  std::optional<int64_t> n_kv_heads = std::nullopt;
  /// Vocabulary size V (rows of the embedding and of the output projection).
  int64_t vocab_size = 128256;
  /// The FFN hidden size is rounded up to a multiple of this.
  int64_t multiple_of = 256;
  /// Optional multiplier of the FFN hidden size (Llama 3: 1.3 for 8B/70B).
  std::optional<double> ffn_dim_multiplier = std::nullopt;
  /// RMSNorm epsilon.
  double norm_eps = 1e-5;
  /// RoPE base.
  double rope_theta = 10000.0;
  /// Longest context the model supports; training.seq_len may not exceed it.
  int64_t max_seq_len = 131072;
  /// Scale the init std of output projections by depth: 0.02/sqrt(2*(layer+1)).
  bool depth_init = true;
  /// Share the embedding matrix with the output projection (Llama 3.2 1B/3B).
  bool tie_word_embeddings = false;
  /// Apply Llama 3.1 RoPE frequency scaling (torchtitan applies it to every flavor).
  bool rope_scaling = true;

  int64_t kv_heads() const { return n_kv_heads.value_or(n_heads); }
  int64_t head_dim() const { return dim / n_heads; }
  /// SwiGLU hidden size: multiple_of * ceil(int(mult * int(8*dim/3)) / multiple_of).
  int64_t ffn_hidden_dim() const;
};

/// torchtitan's flavor table: "debugmodel", "1B", "3B", "8B", "70B", "405B"; plus titan's "100M"
/// (a CPU benchmark size).
/// Throws naming the flavor and listing the known ones.
Llama3Args flavor(std::string_view name);
std::vector<std::string> flavor_names();

}  // namespace titan::llama3
