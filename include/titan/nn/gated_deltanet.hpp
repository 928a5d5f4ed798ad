// SPDX-License-Identifier: BSD-3-Clause
// Gated DeltaNet, the linear attention of Qwen3.5's (and Qwen3-Next's) hybrid blocks, as a decoder block's
// attention sublayer: q, k, v projections, each through a short causal depthwise convolution and SiLU; q and k
// L2-normalised (fp32), q scaled by dk^-1/2; per value head a step beta = sigmoid(wb x) and a log decay
// g = -exp(A_log) softplus(wa x + dt_bias); the gated delta rule (nn/gated_delta_rule.hpp) over the sequence; the
// output RMSNorm-ed per head and gated by silu(wz x); wo back to the model width. No positions: order is the
// recurrence's. Document ids restart the state and the convolution at each new document.
//
// Under context parallelism (contiguous shards: rank r holds the r-th 1/cp of the sequence) rank r runs its tokens
// from what rank r - 1 ended with, passed rank to rank (nn/detail/state_passing.hpp): the last K-1 inputs of each
// convolution and the delta rule's state, one message per layer, and their gradients back in backward. A rank whose
// first token starts a document drops the state it received; the convolution reads the received inputs of its own
// document only.
//
// Every per-head tensor splits over value (and key) heads for tensor parallelism: the projections' rows, the
// convolutions' channels and the decay rates are ShardableLayers a ColwiseParallel style shards on dim 0 (inside the
// attention module, whose input is prepared once, they communicate nothing), wo is rowwise, the output norm (one
// head's features) replicated.
//
//   nn::GatedDeltaNet mixer(dim, {.n_key_heads = 16, .n_value_heads = 32}, options);
//   at::Tensor y = mixer.forward(x, {}, {});   // (B, S, D) -> (B, S, D)
#pragma once

#include <memory>

#include "titan/layout/shardable.hpp"
#include "titan/nn/attention.hpp"

namespace titan::nn {

/// Gated DeltaNet's sizes (HF's linear_* config keys).
struct GatedDeltaNetOptions {
  /// Query and key heads Hk (linear_num_key_heads).
  int64_t n_key_heads = 16;
  /// Value heads Hv, a multiple of Hk: each key head serves Hv / Hk consecutive value heads (linear_num_value_heads).
  int64_t n_value_heads = 32;
  /// Per-head query/key dimension dk, the state's rows (linear_key_head_dim).
  int64_t key_head_dim = 128;
  /// Per-head value dimension dv, the state's columns (linear_value_head_dim).
  int64_t value_head_dim = 128;
  /// Taps of the causal convolution over q, k, v (linear_conv_kernel_dim).
  int64_t conv_kernel = 4;
  /// Epsilon of the per-head output norm.
  double norm_eps = 1e-6;
  /// Tokens per chunk of the training form of the delta rule.
  int64_t chunk_size = 64;
};

/// A causal depthwise convolution over the sequence, no bias: out_t = sum_j weight[:, j] x_{t-K+1+j}. Its channels
/// split like a linear layer's output features.
class CausalConv1d : public torch::nn::Module, public parallel::ShardableLayer {
 public:
  CausalConv1d(int64_t channels, int64_t kernel, const at::TensorOptions& options);
  /// x (B, S, C) -> (B, S, C). Inputs before the sequence come from `history` (B, K-1, C), zeros when undefined;
  /// with document ids an input of another document (nn::document_runs) counts as zero: ids (B, S) of x's tokens
  /// (no history), or (B, K-1+S) of the history's tokens and then x's (a history continued across documents).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& history = {}, const at::Tensor& document_ids = {}) const;
  Role shardable_role() const override { return Role::kLinear; }
  at::Tensor& shardable_weight() override { return weight; }

  at::Tensor weight;  // (C, K), Shard(0) on tp

 private:
  at::Tensor convolve(const at::Tensor& x, const at::Tensor& history, const at::Tensor& document_ids) const;
};

/// Each value head's log decay from its input: g = -exp(weight) * softplus(a), weight = log A (HF's A_log). Its heads
/// split like a linear layer's output features.
class HeadDecay : public torch::nn::Module, public parallel::ShardableLayer {
 public:
  HeadDecay(int64_t heads, const at::TensorOptions& options);
  /// a (..., H) -> g (..., H) fp32 (exp(weight) overflows fp16, softplus loses small inputs in bf16).
  at::Tensor forward(const at::Tensor& a) const;
  Role shardable_role() const override { return Role::kLinear; }
  at::Tensor& shardable_weight() override { return weight; }

  at::Tensor weight;  // (H), Shard(0) on tp
};

class GatedDeltaNet : public AttentionLayer {
 public:
  GatedDeltaNet(int64_t dim, const GatedDeltaNetOptions& options, const at::TensorOptions& tensor_options);
  /// x (B, S, D) -> (B, S, D); `rope` is not read; `context.document_ids` restart the recurrence. Under a
  /// context-parallel split (contiguous shards only) the recurrence continues from the previous cp rank.
  at::Tensor forward(const at::Tensor& x, const RopeTables& rope, const AttentionContext& context) const override;
  /// Decoding: the convolutions' last inputs and the delta rule's state live in `cache` (KVCache::recurrent_state,
  /// slots 0-3 of `layer`); left padding columns are zeroed, so a padded row's state is that of its prompt alone.
  at::Tensor forward_cached(const at::Tensor& x, const RopeTables& rope, const at::Tensor& positions,
                            const at::Tensor& mask, KVCache& cache, int64_t layer) const override;
  /// Projections trunc-normal(0.02), wo trunc-normal(out_std), convolution taps N(0, 1/K) cut at 2 std (a unit input
  /// keeps about unit variance), wa's bias (dt_bias) 1, decay log(A) for A uniform in [0.01, 16) (HF's), norm 1.
  void init_weights(const InitSite& site, double out_std) override;

  GatedDeltaNetOptions options;
  std::shared_ptr<Linear> wq;            // weight (Hk*dk, D)
  std::shared_ptr<Linear> wk;            // weight (Hk*dk, D)
  std::shared_ptr<Linear> wv;            // weight (Hv*dv, D)
  std::shared_ptr<Linear> wz;            // weight (Hv*dv, D): the output gate
  std::shared_ptr<Linear> wb;            // weight (Hv, D): beta
  std::shared_ptr<Linear> wa;            // weight (Hv, D), bias (Hv) (HF's dt_bias): the decay's input
  std::shared_ptr<CausalConv1d> conv_q;  // weight (Hk*dk, K)
  std::shared_ptr<CausalConv1d> conv_k;  // weight (Hk*dk, K)
  std::shared_ptr<CausalConv1d> conv_v;  // weight (Hv*dv, K)
  std::shared_ptr<HeadDecay> decay;      // weight (Hv): log of the decay rate A
  std::shared_ptr<RMSNorm> norm;         // weight (dv)
  std::shared_ptr<Linear> wo;            // weight (D, Hv*dv)

 private:
  /// What a forward carries from the tokens before it: the three convolutions' last K-1 inputs and the state.
  struct Carry {
    at::Tensor q;      // (B, K-1, Hk*dk)
    at::Tensor k;      // (B, K-1, Hk*dk)
    at::Tensor v;      // (B, K-1, Hv*dv)
    at::Tensor state;  // (B, Hv, dk, dv)
  };
  /// The documents of a forward's tokens, as the convolutions and the delta rule read them.
  struct Documents {
    at::Tensor rule;       // (B, S) int64 of the local tokens, or undefined: one document
    at::Tensor conv;       // (B, S), or (B, K-1+S) with the carry's tokens first; undefined: one document
    at::Tensor continues;  // (B) bool: the carried state belongs to the first token's document; undefined: it does
  };
  /// Where the carry comes from and goes to under context parallelism.
  struct Passing {
    const SequenceSharding* sharding = nullptr;
    bool differentiable = false;  // the received carry has a backward (the same on every rank)
  };
  /// x (B, S, D) -> (B, S, D); with `carry`, starts from it and leaves the end there (one token: the recurrent form);
  /// with `passing`, the carry is received from the previous cp rank and its end sent to the next.
  at::Tensor mix(const at::Tensor& x, const Documents& documents, Carry* carry, const Passing* passing) const;
  /// The local tokens of a context-parallel forward, carried over from the previous cp rank.
  at::Tensor context_parallel_mix(const at::Tensor& x, const AttentionContext& context) const;
};

}  // namespace titan::nn
