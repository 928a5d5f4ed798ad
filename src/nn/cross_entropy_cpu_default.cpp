// SPDX-License-Identifier: BSD-3-Clause
// The fused cross-entropy for any CPU: at::vec's portable Vectorized (CMake defines CPU_CAPABILITY=DEFAULT
// for this file, as ATen does).
#define TITAN_CE_KERNELS_NS cpu_default
#include "cross_entropy_kernel.inc"

namespace titan::detail {
void cross_entropy_forward_default(const CrossEntropyRows& rows) { cpu_default::forward_rows(rows); }
void cross_entropy_backward_default(const CrossEntropyRows& rows) { cpu_default::backward_rows(rows); }
}  // namespace titan::detail
