// SPDX-License-Identifier: BSD-3-Clause
// The bf16-moment Adam kernel for AVX2 + FMA CPUs: CMake compiles this file alone with -mavx2 -mfma
// -mf16c -ffp-contract=off and CPU_CAPABILITY=AVX2, so at::vec uses its 256-bit Vectorized;
// adam_bf16_states.cpp calls it only when the CPU has AVX2 and FMA.
#if defined(__AVX2__)
#define TITAN_ADAM_KERNELS_NS cpu_avx2
#include "adam_bf16_states_kernel.inc"

namespace titan::detail {
void adam_bf16_step_avx2(const AdamBf16Args& args) { cpu_avx2::step(args); }
}  // namespace titan::detail
#else
#include "adam_bf16_states_kernel.hpp"

namespace titan::detail {
// Not an x86 build: the portable kernel serves.
void adam_bf16_step_avx2(const AdamBf16Args& args) { adam_bf16_step_default(args); }
}  // namespace titan::detail
#endif
