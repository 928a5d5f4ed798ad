// SPDX-License-Identifier: BSD-3-Clause
// Causal grouped-query self-attention through the SDPA kernels (flash on CPU and CUDA), with RoPE on
// q and k (or no position encoding of its own) and no biases; optionally a head_dim independent of dim, an RMSNorm on
// each q and k head before RoPE (Qwen3's q/k norm), and gpt-oss's projection biases, per-head sinks and sliding window
// (nn/sink_attention.hpp), and Qwen3.5's RoPE on part of each head and sigmoid output gate. The forward's
// nn::AttentionContext supplies per-document positions and masks and, under context parallelism, the sequence's split
// over the cp ranks (see sequence_attention.hpp).
#pragma once

#include <memory>

#include "titan/nn/attention_context.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/layers.hpp"
#include "titan/nn/rope.hpp"

namespace titan::nn {

class KVCache;

/// A decoder block's attention sublayer: nn::Attention, DeepSeek-V3's latent attention, or a user's.
/// models::DecoderBlock calls it through this interface, so a family changes only its attention.
class AttentionLayer : public torch::nn::Module, public ContextParallelCapable {
 public:
  /// x (B, S, D) -> (B, S, D): causal attention of the tokens `context` describes, RoPE from `rope`.
  virtual at::Tensor forward(const at::Tensor& x, const RopeTables& rope, const AttentionContext& context) const = 0;
  /// Inference over a KV cache (nn/kv_cache.hpp): x (B, S, D) are the next S columns of `cache` at
  /// `positions` (B, S) or (S); the layer appends its keys and values under `layer` and attends with
  /// `mask` (B or 1, 1, S, T). Throws where the layer has no cached form.
  virtual at::Tensor forward_cached(const at::Tensor& x, const RopeTables& rope, const at::Tensor& positions,
                                    const at::Tensor& mask, KVCache& cache, int64_t layer) const;
  /// Fills the weights; `site` names this layer, `out_std` is the std of the output projection.
  virtual void init_weights(const InitSite& site, double out_std) = 0;
};

/// How attention itself encodes positions.
enum class PositionEncoding {
  /// Rotary embeddings on q and k (Llama, Qwen3, DeepSeek-V3, gpt-oss): the forward's RopeTables.
  rope,
  /// None: positions reach the model elsewhere (GPT-2's learned absolute position embeddings, added to the token
  /// embeddings); the forward's RopeTables are not read and may be empty.
  none,
};

/// What Attention adds to Llama's shape.
struct AttentionOptions {
  /// Rotary embeddings on q and k, or none.
  PositionEncoding position_encoding = PositionEncoding::rope;
  /// Per-head dimension; 0 = dim / n_heads (Llama). Qwen3 sets it on its own (n_heads * head_dim != dim).
  int64_t head_dim = 0;
  /// RMSNorm every query and key head over head_dim before RoPE (Qwen3), weights q_norm, k_norm (HD).
  bool qk_norm = false;
  /// Epsilon of the q/k norms.
  double qk_norm_eps = 1e-6;
  /// The q/k norms scale by 1 + weight (Qwen3.5's zero-centred norms, nn::RMSNorm's unit_offset).
  bool qk_norm_unit_offset = false;
  /// RoPE rotates the first rotary_dim features of each q/k head and passes the rest (Qwen3.5: head_dim / 4);
  /// 0 = all of them. The RopeTables cover rotary_dim.
  int64_t rotary_dim = 0;
  /// A sigmoid gate per output feature, sigmoid(wg x) with wg (H*HD, D), multiplies the attention output before wo
  /// (Qwen3.5's gated attention).
  bool output_gate = false;
  /// wq/wk/wv/wo have biases (gpt-oss).
  bool bias = false;
  /// A learned logit per query head joins every softmax denominator, `sinks` (H) (gpt-oss).
  bool sinks = false;
  /// Keys a query sees: itself and sliding_window - 1 before it; 0 = every earlier key.
  int64_t sliding_window = 0;
};

class Attention : public AttentionLayer {
 public:
  Attention(int64_t dim, int64_t n_heads, int64_t n_kv_heads, const at::TensorOptions& options,
            const AttentionOptions& extra = {});
  /// x (B, S, D) -> (B, S, D), causal over the whole window; `context` as in nn::causal_attention.
  at::Tensor forward(const at::Tensor& x, const RopeTables& rope, const AttentionContext& context = {}) const override;
  at::Tensor forward_cached(const at::Tensor& x, const RopeTables& rope, const at::Tensor& positions,
                            const at::Tensor& mask, KVCache& cache, int64_t layer) const override;
  /// torchtitan's init: wq/wk/wv trunc-normal(0.02), wo trunc-normal(out_std); q/k norms to ones. With
  /// biases (torchtitan's gpt-oss) every projection's weight and bias, and the sinks, draw trunc-normal(out_std).
  void init_weights(const InitSite& site, double out_std) override;

  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t sliding_window;  // 0: full causal
  int64_t rotary_dim;      // features of each head RoPE rotates (head_dim: all)
  PositionEncoding position_encoding;
  std::shared_ptr<Linear> wq;       // weight (H*HD, D), bias (H*HD) with bias
  std::shared_ptr<Linear> wk;       // weight (KVH*HD, D), bias (KVH*HD) with bias
  std::shared_ptr<Linear> wv;       // weight (KVH*HD, D), bias (KVH*HD) with bias
  std::shared_ptr<Linear> wo;       // weight (D, H*HD), bias (D) with bias
  std::shared_ptr<Linear> wg;       // weight (H*HD, D); null without output_gate
  at::Tensor sinks;                 // (H); undefined without sinks
  std::shared_ptr<RMSNorm> q_norm;  // weight (HD); null without qk_norm
  std::shared_ptr<RMSNorm> k_norm;  // weight (HD); null without qk_norm

 private:
  /// x (B, S, heads, HD) at `positions` rotated by RoPE (its first rotary_dim features), or as is without a
  /// position encoding of its own.
  at::Tensor rotate(const at::Tensor& x, const RopeTables& rope, const at::Tensor& positions) const;
  /// The attention output (B, S, H*HD) through the output gate, then wo: (B, S, D).
  at::Tensor project_out(const at::Tensor& out, const at::Tensor& x) const;
  /// q (B, H, S, HD), k, v (B, KVH, S, HD) -> (B, H, S, HD): causal, or with the sinks and window.
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const AttentionContext& context) const;
};

/// SwiGLU feed-forward: w2(silu(w1 x) * w3 x).
class FeedForward : public torch::nn::Module {
 public:
  FeedForward(int64_t dim, int64_t hidden_dim, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // (B, S, D) -> (B, S, D)
  /// torchtitan's init: w1 trunc-normal(0.02); w2, w3 trunc-normal(out_std); `site` names this layer.
  void init_weights(const InitSite& site, double out_std);

  std::shared_ptr<Linear> w1;  // weight (F, D)
  std::shared_ptr<Linear> w2;  // weight (D, F)
  std::shared_ptr<Linear> w3;  // weight (F, D)
};

}  // namespace titan::nn
