// SPDX-License-Identifier: BSD-3-Clause
// What the decoder skeleton (models/decoder.hpp) and its sharding spec (models/decoder_spec.hpp) need to
// know of a family's arguments. A family fills one from its args; everything else is written once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace titan::models {

struct DecoderShape {
  /// Prefix of errors ("titan::llama3").
  const char* where = "titan::models";
  /// Vocabulary size V (rows of the embedding and of the output projection).
  int64_t vocab_size = 0;
  /// Residual stream width D.
  int64_t dim = 0;
  /// Number of blocks (layers.0 .. layers.{n_layers-1}).
  int64_t n_layers = 0;
  /// Query heads per block.
  int64_t n_heads = 0;
  /// Key/value heads per block.
  int64_t n_kv_heads = 0;
  /// Per-head query/key dimension (for the attention FLOPs).
  int64_t head_dim = 0;
  /// Per-head value dimension (for the attention FLOPs).
  int64_t v_head_dim = 0;
  /// Epsilon of the block norms and the final norm.
  double norm_eps = 1e-5;
  /// The block norms and the final norm scale by 1 + weight (Qwen3.5's zero-centred norms).
  bool norm_unit_offset = false;
  /// Longest sequence the model supports; training.seq_len may not exceed it.
  int64_t max_seq_len = 0;
  /// The output projection is the embedding matrix (no `output` module).
  bool tied = false;
  /// Attention projections split over heads under TP (ColwiseParallel), by name inside `layers.N.attention`.
  std::vector<std::string> head_projections{"wq", "wk", "wv"};
  /// Attention modules that see every head's input or one head's features (Qwen3's q_norm/k_norm, MLA's
  /// down-projections): under TP their weights stay whole on each rank and their gradients are summed.
  std::vector<std::string> replicated_attention{};
  /// Blocks whose feed-forward is `layers.N.moe` (an nn::MoE) instead of `layers.N.feed_forward`.
  std::vector<int64_t> moe_layers{};
  /// Those MoE layers have `moe.shared_experts`.
  bool shared_experts = false;
  /// Their shared experts' output is scaled by a sigmoid gate, `moe.shared_gate` (Qwen3.5-MoE).
  bool shared_expert_gate = false;
  /// Blocks whose attention is linear (Gated DeltaNet): a recurrent state in place of a softmax over the sequence.
  std::vector<int64_t> linear_attention_layers{};
  /// Training FLOPs per token of one such block's recurrence (beside its projections' 6N); none grow with S.
  int64_t linear_attention_flops = 0;
  /// Experts each token is routed to (for the active-parameter FLOPs); 0 without MoE.
  int64_t moe_top_k = 0;
  /// Routed experts per MoE layer; 0 without MoE.
  int64_t moe_num_experts = 0;
  /// Pipeline and context parallelism are built for the family (else its plan refuses pp and cp > 1).
  bool pipeline_and_context_parallel = true;
  /// Tensor parallelism is built for the family (else its plan refuses tp > 1; the planner's search skips it).
  bool tensor_parallel = true;
};

}  // namespace titan::models
