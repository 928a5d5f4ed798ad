// SPDX-License-Identifier: BSD-3-Clause
// Causal grouped-query self-attention through the SDPA kernels (flash on CPU and CUDA), with RoPE on
// q and k and no biases; optionally a head_dim independent of dim and an RMSNorm on each q and k head
// before RoPE (Qwen3's q/k norm). The running nn::AttentionContext supplies per-document positions and masks
// and, under context parallelism, the sequence's split over the cp ranks (see sequence_attention.hpp).
#pragma once

#include <memory>

#include "titan/nn/attention_context.hpp"
#include "titan/nn/layers.hpp"
#include "titan/nn/rope.hpp"

namespace titan::nn {

/// What Attention adds to Llama's shape.
struct AttentionOptions {
  /// Per-head dimension; 0 = dim / n_heads (Llama). Qwen3 sets it on its own (n_heads * head_dim != dim).
  int64_t head_dim = 0;
  /// RMSNorm every query and key head over head_dim before RoPE (Qwen3), weights q_norm, k_norm (HD).
  bool qk_norm = false;
  /// Epsilon of the q/k norms.
  double qk_norm_eps = 1e-6;
};

class Attention : public torch::nn::Module, public ContextParallelCapable {
 public:
  Attention(int64_t dim, int64_t n_heads, int64_t n_kv_heads, const at::TensorOptions& options,
            const AttentionOptions& extra = {});
  /// x (B, S, D) -> (B, S, D), causal over the whole window.
  at::Tensor forward(const at::Tensor& x, const RopeTables& rope) const;
  /// torchtitan's init: wq/wk/wv trunc-normal(0.02), wo trunc-normal(out_std); q/k norms to ones.
  void init_weights(double out_std);

  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  std::shared_ptr<Linear> wq;       // weight (H*HD, D)
  std::shared_ptr<Linear> wk;       // weight (KVH*HD, D)
  std::shared_ptr<Linear> wv;       // weight (KVH*HD, D)
  std::shared_ptr<Linear> wo;       // weight (D, H*HD)
  std::shared_ptr<RMSNorm> q_norm;  // weight (HD); null without qk_norm
  std::shared_ptr<RMSNorm> k_norm;  // weight (HD); null without qk_norm
};

/// SwiGLU feed-forward: w2(silu(w1 x) * w3 x).
class FeedForward : public torch::nn::Module {
 public:
  FeedForward(int64_t dim, int64_t hidden_dim, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // (B, S, D) -> (B, S, D)
  /// torchtitan's init: w1 trunc-normal(0.02); w2, w3 trunc-normal(out_std).
  void init_weights(double out_std);

  std::shared_ptr<Linear> w1;  // weight (F, D)
  std::shared_ptr<Linear> w2;  // weight (D, F)
  std::shared_ptr<Linear> w3;  // weight (F, D)
};

}  // namespace titan::nn
