// SPDX-License-Identifier: BSD-3-Clause
// What a tensor-parallel style may do with a layer: shard its weight (and a linear layer's bias) along the role's
// dims. A layer says what it is by implementing this interface (titan::nn::Linear, Embedding and TiedLinear do); the
// styles never look at concrete layer types, so a user's own projection can be named by a plan too.
#pragma once

#include <ATen/core/Tensor.h>

namespace titan::dist {
class ProcessGroup;
}

namespace titan::parallel {

/// A layer whose weight a ColwiseParallel / RowwiseParallel style may shard.
class ShardableLayer {
 public:
  enum class Role {
    kLinear,     ///< y = x W^T with W (out_features, in_features): colwise shards dim 0, rowwise dim 1
    kEmbedding,  ///< rows of W (vocab, dim) looked up by token: rowwise shards dim 0 (the vocabulary)
  };
  virtual ~ShardableLayer() = default;
  virtual Role shardable_role() const = 0;
  /// The registered weight parameter (the style rebinds it to its tp shard).
  virtual at::Tensor& shardable_weight() = 0;
  /// A linear layer's registered bias (out_features), or null: colwise shards it with the output features; rowwise
  /// keeps it whole and adds it once, after the sum over tp (add_bias).
  virtual at::Tensor* shardable_bias() { return nullptr; }
  /// y (..., out) plus the bias, as the layer's forward adds it; a rowwise style calls it after the reduction.
  virtual at::Tensor add_bias(const at::Tensor& y) const { return y; }
  /// A linear layer's low-rank adapter weights (LoRA: A (rank, in_features), B (out_features, rank)), or nulls. A
  /// colwise style keeps A whole (its gradient summed over tp) and shards B with the output features; a rowwise style
  /// shards A with the input features and keeps B whole (summed): each rank's adapter output is then the same kind of
  /// part (a column block, a partial sum) as its base output, and the parts add up as the weight's do.
  struct Adapter {
    at::Tensor* a = nullptr;  ///< (rank, in_features)
    at::Tensor* b = nullptr;  ///< (out_features, rank)
  };
  virtual Adapter shardable_adapter() { return {}; }
  /// Whether the weight belongs to another layer (a head tied to an embedding, nn::TiedLinear): the owner's style
  /// shards it, and a colwise style on this layer computes on that shard without sharding it again.
  virtual bool tied() const { return false; }

  /// Set by a rowwise style while it lives: the layer's forward leaves its bias out and the style adds it after
  /// summing the partial outputs (added before, it would be counted once per rank).
  bool bias_after_reduction = false;

  /// The tensor-parallel group the style sharded the weight over (null: none, or one rank); the layer's
  /// forward hands it to a float8 matmul, whose tensorwise scales then span the shards. Set by the style,
  /// cleared by its handle.
  const dist::ProcessGroup* tp_group = nullptr;
};

}  // namespace titan::parallel
