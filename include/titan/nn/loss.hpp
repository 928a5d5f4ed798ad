// SPDX-License-Identifier: BSD-3-Clause
// Token-level cross-entropy as torchtitan computes it: summed over valid tokens (label != -100) in
// fp32, then divided by the number of valid tokens of the whole global batch, so gradient
// accumulation and data parallelism give the exact global token mean.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace titan {

inline constexpr int64_t kIgnoreIndex = -100;

/// Sum of per-token cross-entropy over valid labels.
at::Tensor cross_entropy_sum(const at::Tensor& logits,   // (B, S, V)
                             const at::Tensor& labels);  // (B, S) int64, kIgnoreIndex = skip

/// A summed token loss: (logits (B, S, V or V/tp), labels (B, S)) -> () (cross_entropy_sum by default;
/// TensorParallel::cross_entropy_sum under loss parallel).
using LossFn = std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& labels)>;

/// Number of labels != kIgnoreIndex.
int64_t count_valid_tokens(const at::Tensor& labels);  // (B, S)

}  // namespace titan
