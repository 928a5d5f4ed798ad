// SPDX-License-Identifier: BSD-3-Clause
// titan's CPU float8 cast kernels on raw pointers, compiled once per CPU capability
// (cast_kernels.inc in cast_cpu_default.cpp and, with -mavx2 -mfma, cast_cpu_avx2.cpp); cast.cpp picks
// the widest one the CPU runs. Tensors, checks and allocation stay in cast.cpp.
#pragma once

#include <cstdint>

namespace titan::float8::detail {

enum class Source { kFloat, kBFloat16, kHalf };
enum class Target { kE4M3FN, kE5M2 };
/// The scales of a values kernel: one, one per row of x, or one per column of x.
enum class ValuesScales { kTensor, kRow, kColumn };

/// One cast: x (rows, cols) row-major -> out (rows, cols), or (cols, rows) for the transposed kernels.
struct CastArgs {
  const void* x = nullptr;  ///< (rows, cols) of `source`
  int64_t rows = 0;         ///< R
  int64_t cols = 0;         ///< C
  Source source = Source::kFloat;
  Target target = Target::kE4M3FN;
  bool power_of_2 = false;  ///< round scales down to powers of 2
  uint8_t* out = nullptr;   ///< float8 bytes
  float* scale = nullptr;   ///< 1 (tensorwise), rows (rowwise) or cols (rowwise transposed) floats
  float* values = nullptr;  ///< the values kernel: float(code) times 1 / scale (or over it) instead of codes
  ValuesScales values_scales = ValuesScales::kTensor;  ///< the values kernel: which scales
  bool values_transposed = false;                      ///< the values kernel: values (C, R) instead of (R, C)
  bool divide = false;       ///< the values kernel: float(code) / scale (the emulated GEMMs), not times 1 / scale
  bool scale_given = false;  ///< the values kernel, one scale: scale[0] is the caller's, no amax pass
};

/// The four kernels of one CPU capability.
struct CpuCastKernels {
  void (*tensorwise)(const CastArgs&) = nullptr;             ///< out (R, C), scale[1]
  void (*rowwise)(const CastArgs&) = nullptr;                ///< out (R, C), scale[R]
  void (*tensorwise_transposed)(const CastArgs&) = nullptr;  ///< out (C, R), scale[1]
  void (*rowwise_transposed)(const CastArgs&) = nullptr;     ///< out (C, R), scale[C]
  void (*values)(const CastArgs&) = nullptr;                 ///< values (R, C) or (C, R); scale[1], [R] or [C]
  const char* name = "";                                     ///< "default" or "avx2"
};

const CpuCastKernels& cpu_cast_kernels_default();
const CpuCastKernels& cpu_cast_kernels_avx2();

}  // namespace titan::float8::detail
