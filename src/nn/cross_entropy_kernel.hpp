// SPDX-License-Identifier: BSD-3-Clause
// The fused token cross-entropy on raw pointers, compiled once per CPU capability
// (cross_entropy_kernel.inc in cross_entropy_cpu_default.cpp and, with -mavx2 -mfma,
// cross_entropy_cpu_avx2.cpp); cross_entropy.cpp picks the widest one the CPU runs and keeps the tensors,
// the checks and the autograd node.
#pragma once

#include <cstdint>

namespace titan::detail {

/// Rows of logits and their labels. The forward fills row_max, log_sum and row_loss; the backward reads
/// row_max and log_sum and writes grad = grad_scale * (softmax(row) - onehot(label)), in the logits' dtype.
/// The log-softmax is (x - row_max) - log_sum, as ATen forms it: an fp32 log-sum-exp of large logits would
/// lose the digits that the shift by the row's max keeps.
struct CrossEntropyRows {
  const void* logits = nullptr;     ///< (rows, vocab) contiguous; float, or c10::BFloat16 when bf16
  bool bf16 = false;                ///< the logits and the gradient are bf16, else float
  const int64_t* labels = nullptr;  ///< (rows) in [0, vocab) or ignore_index
  int64_t rows = 0;                 ///< tokens
  int64_t vocab = 0;                ///< logits per row
  int64_t ignore_index = -100;      ///< a label that adds nothing to the loss and gets a zero gradient row
  float* row_max = nullptr;         ///< (rows) each row's largest logit, the shift (0 for an ignored row)
  float* log_sum = nullptr;         ///< (rows) log(sum(exp(x - row_max))) in fp32 (0 for an ignored row)
  float* row_loss = nullptr;        ///< (rows) -log_softmax[label] (0 for an ignored row); forward only
  float grad_scale = 1;             ///< the summed loss's gradient; backward only
  void* grad = nullptr;             ///< (rows, vocab) contiguous, the logits' dtype; backward only
};

void cross_entropy_forward_default(const CrossEntropyRows& rows);
void cross_entropy_forward_avx2(const CrossEntropyRows& rows);
void cross_entropy_backward_default(const CrossEntropyRows& rows);
void cross_entropy_backward_avx2(const CrossEntropyRows& rows);

}  // namespace titan::detail
