// SPDX-License-Identifier: BSD-3-Clause
// What a tensor-parallel style may do with a layer: shard its weight along the role's dims. A layer
// says what it is by implementing this interface (titan::nn::Linear and Embedding do); the styles
// never look at concrete layer types, so a user's own projection can be named by a plan too.
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

  /// The tensor-parallel group the style sharded the weight over (null: none, or one rank); the layer's
  /// forward hands it to a float8 matmul, whose tensorwise scales then span the shards. Set by the style,
  /// cleared by its handle.
  const dist::ProcessGroup* tp_group = nullptr;
};

}  // namespace titan::parallel
