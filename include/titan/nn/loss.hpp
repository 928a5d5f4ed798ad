// SPDX-License-Identifier: BSD-3-Clause
// Token-level cross-entropy as torchtitan computes it: summed over valid tokens (label != -100) in
// fp32, then divided by the number of valid tokens of the whole global batch, so gradient
// accumulation and data parallelism give the exact global token mean. On CPU, contiguous float or bf16
// logits take a fused kernel: one pass for each row's log-sum-exp in fp32, one for the gradient, written
// in the logits' dtype; it keeps the logits and two floats per row for backward, where the ATen twin keeps
// an fp32 log-softmax of the whole (B*S, V) and makes an fp32 copy of bf16 logits first.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace titan {

inline constexpr int64_t kIgnoreIndex = -100;

/// Sum of per-token cross-entropy over valid labels: the fused CPU kernel where it runs, else the twin.
at::Tensor cross_entropy_sum(const at::Tensor& logits,   // (B, S, V)
                             const at::Tensor& labels);  // (B, S) int64, kIgnoreIndex = skip

/// The plain ATen twin: cross_entropy over the logits upcast to fp32, summed (what the kernel is held to).
at::Tensor cross_entropy_sum_reference(const at::Tensor& logits,   // (B, S, V)
                                       const at::Tensor& labels);  // (B, S) int64, kIgnoreIndex = skip

/// A summed token loss: (logits (B, S, V or V/tp), labels (B, S)) -> () (cross_entropy_sum by default;
/// TensorParallel::cross_entropy_sum under loss parallel).
using LossFn = std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& labels)>;

/// Number of labels != kIgnoreIndex.
int64_t count_valid_tokens(const at::Tensor& labels);  // (B, S)

}  // namespace titan
