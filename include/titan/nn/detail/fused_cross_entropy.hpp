// SPDX-License-Identifier: BSD-3-Clause
// The fused CPU cross-entropy behind cross_entropy_sum, by build (tests and benchmarks compare the builds
// with each other and with cross_entropy_sum_reference).
//
//   for (const auto& build : titan::detail::fused_cross_entropy_builds())
//     titan::detail::fused_cross_entropy_sum(logits, labels, build).backward();
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>
#include <vector>

namespace titan::detail {

/// Whether cross_entropy_sum takes the fused kernel for these tensors: contiguous float or bf16 logits
/// on CPU.
bool fused_cross_entropy_runs(const at::Tensor& logits);  // (B, S, V)

/// The kernel builds this CPU runs, widest first: {"avx2", "default"} on AVX2 + FMA CPUs, else {"default"}.
std::vector<std::string> fused_cross_entropy_builds();

/// cross_entropy_sum through the named build (differentiable in the logits).
at::Tensor fused_cross_entropy_sum(const at::Tensor& logits,  // (B, S, V)
                                   const at::Tensor& labels,  // (B, S) int64
                                   std::string_view build);

}  // namespace titan::detail
