// SPDX-License-Identifier: BSD-3-Clause
// The float8 cast kernels for AVX2 + FMA CPUs: CMake compiles this file alone with -mavx2 -mfma -mf16c
// and CPU_CAPABILITY=AVX2, so at::vec uses its 256-bit Vectorized; cast.cpp calls it only when the
// CPU has AVX2 (elsewhere the table below is never reached).
#if defined(__AVX2__)
#define TITAN_FLOAT8_KERNELS_NS cpu_avx2
#define TITAN_FLOAT8_KERNELS_NAME "avx2"
#include "cast_kernels.inc"

namespace titan::float8::detail {
const CpuCastKernels& cpu_cast_kernels_avx2() { return cpu_avx2::kernels(); }
}  // namespace titan::float8::detail
#else
#include "cast_kernels.hpp"

namespace titan::float8::detail {
// Not an x86 build: the portable kernels serve.
const CpuCastKernels& cpu_cast_kernels_avx2() { return cpu_cast_kernels_default(); }
}  // namespace titan::float8::detail
#endif
