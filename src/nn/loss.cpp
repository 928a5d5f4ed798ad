// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/loss.hpp"

#include <ATen/ATen.h>

namespace titan {

at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) {
  const at::Tensor flat = logits.flatten(0, 1).to(at::kFloat);  // (B*S, V) fp32 for a stable log-softmax
  return at::cross_entropy_loss(flat, labels.flatten(), /*weight=*/std::nullopt, at::Reduction::Sum, kIgnoreIndex);
}

int64_t count_valid_tokens(const at::Tensor& labels) { return labels.ne(kIgnoreIndex).sum().item<int64_t>(); }

}  // namespace titan
