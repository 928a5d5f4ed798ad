// SPDX-License-Identifier: BSD-3-Clause
// titan's CPU float8 cast kernels on raw pointers, compiled once per CPU capability
// (cast_kernels.inc in cast_cpu_default.cpp and, with -mavx2 -mfma, cast_cpu_avx2.cpp); cast.cpp picks
// the widest one the CPU runs. Tensors, checks and allocation stay in cast.cpp.
#pragma once

#include <cstdint>

namespace titan::float8::detail {

enum class Source { kFloat, kBFloat16, kHalf };
enum class Target { kE4M3FN, kE5M2 };

/// One cast: x (rows, cols) row-major -> out (rows, cols), or (cols, rows) for the transposed kernels.
struct CastArgs {
  const void* x = nullptr;  ///< (rows, cols) of `source`
  int64_t rows = 0;         ///< R
  int64_t cols = 0;         ///< C
  Source source = Source::kFloat;
  Target target = Target::kE4M3FN;
  bool power_of_2 = false;   ///< round scales down to powers of 2
  uint8_t* out = nullptr;    ///< float8 bytes
  float* scale = nullptr;    ///< 1 (tensorwise), rows (rowwise) or cols (rowwise transposed) floats
  float* values = nullptr;   ///< the *_values kernels: float(code) * (1 / scale) instead of the codes in `out`
  bool scale_given = false;  ///< the *_values kernels: scale[0] is the caller's, no amax pass
};

/// The four kernels of one CPU capability.
struct CpuCastKernels {
  void (*tensorwise)(const CastArgs&) = nullptr;                    ///< out (R, C), scale[1]
  void (*rowwise)(const CastArgs&) = nullptr;                       ///< out (R, C), scale[R]
  void (*tensorwise_transposed)(const CastArgs&) = nullptr;         ///< out (C, R), scale[1]
  void (*rowwise_transposed)(const CastArgs&) = nullptr;            ///< out (C, R), scale[C]
  void (*tensorwise_values)(const CastArgs&) = nullptr;             ///< values (R, C), scale[1]
  void (*tensorwise_values_transposed)(const CastArgs&) = nullptr;  ///< values (C, R), scale[1]
  const char* name = "";                                            ///< "default" or "avx2"
};

const CpuCastKernels& cpu_cast_kernels_default();
const CpuCastKernels& cpu_cast_kernels_avx2();

}  // namespace titan::float8::detail
