// SPDX-License-Identifier: BSD-3-Clause
// One block pair of blockwise attention: the SDPA kernels that also return the log-sum-exp of each
// query row (flash on CPU, memory-efficient on CUDA, which takes an additive mask), their backward,
// and the log-sum-exp merge of partial outputs.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>

namespace titan::nn::detail {

/// How a block's queries see its keys.
struct BlockMask {
  /// Query i sees key j <= i (a diagonal block: both sides are the same chunk of the sequence).
  bool causal = false;
  /// Additive mask (B, 1, Lq, Lk) in q's dtype, 0 or -inf; undefined: no mask.
  at::Tensor additive{};
  /// (B, 1, Lq) true where a row sees at least one key; undefined: every row does.
  at::Tensor visible{};
};

struct BlockResult {
  at::Tensor out;  // (B, H, Lq, HD) in q's dtype
  at::Tensor lse;  // (B, H, Lq) float32, -inf on rows that see no key
};

/// softmax(q k^T * scale + mask) v with its row log-sum-exp.
BlockResult attend_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const BlockMask& mask,
                         double scale);

/// Gradients (dq, dk, dv) of one block given the MERGED output and log-sum-exp of its query rows
/// (the probabilities are exp(s - lse) with the global normaliser, so the blocks' gradients add up
/// to the whole attention's).
std::array<at::Tensor, 3> attend_block_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                const BlockMask& mask, double scale);

/// Folds a block into the running (out, lse) of its query rows; both float32, out (B, H, Lq, HD),
/// lse (B, H, Lq), starting from zeros and -inf.
void merge_block(at::Tensor& out, at::Tensor& lse, const BlockResult& block);

}  // namespace titan::nn::detail
