// SPDX-License-Identifier: BSD-3-Clause
// The fused cross-entropy for AVX2 + FMA CPUs: CMake compiles this file alone with -mavx2 -mfma -mf16c and
// CPU_CAPABILITY=AVX2, so at::vec uses its 256-bit Vectorized (Sleef's exp); cross_entropy.cpp calls it only
// when the CPU has AVX2 and FMA.
#if defined(__AVX2__)
#define TITAN_CE_KERNELS_NS cpu_avx2
#include "cross_entropy_kernel.inc"

namespace titan::detail {
void cross_entropy_forward_avx2(const CrossEntropyRows& rows) { cpu_avx2::forward_rows(rows); }
void cross_entropy_backward_avx2(const CrossEntropyRows& rows) { cpu_avx2::backward_rows(rows); }
}  // namespace titan::detail
#else
#include "cross_entropy_kernel.hpp"

namespace titan::detail {
// Not an x86 build: the portable kernel serves.
void cross_entropy_forward_avx2(const CrossEntropyRows& rows) { cross_entropy_forward_default(rows); }
void cross_entropy_backward_avx2(const CrossEntropyRows& rows) { cross_entropy_backward_default(rows); }
}  // namespace titan::detail
#endif
