// SPDX-License-Identifier: BSD-3-Clause
// The basic layers every titan model is built from. They own plain parameters (no biases unless a
// model asks, as gpt-oss and GPT-2-shaped models do; Llama has none) created on any device, including meta, so a
// 405B model can be counted without memory.
// Parallelism (FSDP, TP) wraps or re-places these parameters later; the math lives here once.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>

#include "titan/layout/shardable.hpp"
#include "titan/layout/sharded_param.hpp"

namespace titan::nn {

/// A Linear's matmul as a model converter replaces it: x (..., in), w (out, in) -> (..., out),
/// differentiable in both (float8::convert_to_float8 installs float8 GEMMs); `use` says how the layout
/// gathered and sharded w.
using LinearMatmul =
    std::function<at::Tensor(const at::Tensor& x, const at::Tensor& w, const parallel::WeightUse& use)>;

class Linear;

/// A low-rank adapter beside a Linear's weight (LoRA, nn::add_lora): the Linear's output gains
/// scale * b(a(dropout(x))), computed in the adapters' own (high) precision whatever computes the base matmul.
struct LowRankAdapter {
  std::shared_ptr<Linear> a{};  ///< registered as lora_a: weight (rank, in_features)
  std::shared_ptr<Linear> b{};  ///< registered as lora_b: weight (out_features, rank)
  double scale = 1.0;           ///< alpha / rank
  double dropout = 0.0;         ///< on the adapter's input, while the module is in training mode
};

/// y = x W^T, plus b with a bias (plus a low-rank adapter's output when one is set).
class Linear : public torch::nn::Module, public parallel::ShardableLayer {
 public:
  Linear(int64_t in_features, int64_t out_features, const at::TensorOptions& options, bool bias = false);
  at::Tensor forward(const at::Tensor& x) const;  // (..., in) -> (..., out)
  Role shardable_role() const override { return Role::kLinear; }
  at::Tensor& shardable_weight() override { return weight; }
  at::Tensor* shardable_bias() override { return bias.defined() ? &bias : nullptr; }
  at::Tensor add_bias(const at::Tensor& y) const override;  // (..., out) -> (..., out)
  Adapter shardable_adapter() override;

  at::Tensor weight;      // (out_features, in_features)
  at::Tensor bias;        // (out_features); undefined without a bias
  LinearMatmul matmul{};  // set by a model converter; empty = at::linear (kept under per-operator AC)
  std::shared_ptr<const LowRankAdapter> lora{};  // set by nn::add_lora; null = none
};

/// Token embedding lookup.
class Embedding : public torch::nn::Module, public parallel::ShardableLayer {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& tokens) const;  // (B, S) int64 -> (B, S, D)
  Role shardable_role() const override { return Role::kEmbedding; }
  at::Tensor& shardable_weight() override { return weight; }

  at::Tensor weight;  // (V, D)
};

/// An output projection that is an Embedding's weight read the other way (tied input and output embeddings):
/// y = x E^T with E the embedding's (V, D) weight. It owns no parameter, so the model's parameters hold E once, under
/// the embedding's name; under FSDP it reads E through with_param as the embedding does. Under tensor parallelism the
/// embedding's vocab split (Shard(0)) is the colwise split of this head, so a colwise style here computes on that shard
/// (loss parallel: vocab-sharded logits) and shards nothing.
class TiedLinear : public torch::nn::Module, public parallel::ShardableLayer {
 public:
  explicit TiedLinear(std::shared_ptr<Embedding> embedding);
  at::Tensor forward(const at::Tensor& x) const;  // (..., D) -> (..., V)
  Role shardable_role() const override { return Role::kLinear; }
  at::Tensor& shardable_weight() override { return embedding_->weight; }
  bool tied() const override { return true; }

 private:
  std::shared_ptr<Embedding> embedding_;  // not registered here: it is the model's module under its own name
};

/// RMSNorm: x / sqrt(mean(x^2) + eps) * weight, computed in fp32 and cast back. With unit_offset the scale is
/// 1 + weight (Gemma's and Qwen3.5's zero-centred norms: the weight starts at 0, where bf16 is finest, and weight
/// decay pulls the scale toward 1), computed in fp32.
class RMSNorm : public torch::nn::Module {
 public:
  RMSNorm(int64_t dim, double eps, const at::TensorOptions& options, bool unit_offset = false);
  at::Tensor forward(const at::Tensor& x) const;  // (..., D) -> (..., D)
  /// The identity scale: weight 1, or 0 with unit_offset.
  void reset_parameters();

  at::Tensor weight;  // (D)
  double eps;
  bool unit_offset;
};

/// LayerNorm: (x - mean(x)) / sqrt(var(x) + eps) * weight + bias over the last dim (biased variance, as
/// torch.nn.LayerNorm), at::layer_norm's numerics (fp32 statistics for bf16 input). Under tensor parallelism it takes
/// the sequence_norm role as RMSNorm does: weight and bias whole, their gradients summed over tp.
class LayerNorm : public torch::nn::Module {
 public:
  LayerNorm(int64_t dim, double eps, const at::TensorOptions& options, bool bias = true);
  at::Tensor forward(const at::Tensor& x) const;  // (..., D) -> (..., D)
  /// weight ones, bias zeros (torch.nn.LayerNorm's reset_parameters).
  void reset_parameters();

  at::Tensor weight;  // (D)
  at::Tensor bias;    // (D); undefined without a bias
  double eps;
};

}  // namespace titan::nn
