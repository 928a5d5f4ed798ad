// SPDX-License-Identifier: BSD-3-Clause
// A model's size as MFU counts it, the same whenever it is asked: before parallelize, after it (FSDP and TP leave
// each rank a shard of every tensor; these count the whole tensors), on the meta device or a real one.
//
//   int64_t MyModel::num_params() const { return nn::parameter_count(*this); }
//   int64_t MyModel::num_flops_per_token(int64_t seq_len) const {
//     return nn::training_flops_per_token({.matmul_params = num_params() - nn::parameter_count(*pos_embed),
//                                          .layers = 4, .heads = 4, .head_dim = 16, .seq_len = seq_len});
//   }
#pragma once

#include <cstdint>

namespace torch::nn {
class Module;
}

namespace titan::nn {

/// Elements of module's parameters, each tensor once (a weight registered under two names counts once), by global
/// shape (parallel::global_numel). Under pipeline parallelism a rank holds only its stages: count the whole model,
/// built on the meta device.
int64_t parameter_count(const torch::nn::Module& module);

/// What a dense transformer's training FLOPs per token depend on (torchtitan's estimate).
struct TransformerFlops {
  /// Parameters that multiply activations: every one but lookup tables (token and position embeddings); a tied
  /// embedding is also the head's matmul and counts.
  int64_t matmul_params = 0;
  /// Attention layers, query heads, and the dims of a head's query/key and of its value.
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  /// 0: head_dim.
  int64_t v_head_dim = 0;
  /// Tokens each query attends over (the training sequence length).
  int64_t seq_len = 0;
};

/// 6 per matmul parameter (forward 2, backward 4) plus attention's scores and weighted values,
/// 6 * layers * heads * (head_dim + v_head_dim) * seq_len.
int64_t training_flops_per_token(const TransformerFlops& f);

}  // namespace titan::nn
