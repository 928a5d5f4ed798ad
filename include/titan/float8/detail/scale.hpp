// SPDX-License-Identifier: BSD-3-Clause
// The scale of one amax, shared by the CPU kernels, the CUDA kernels and (as tensor ops) the ATen
// reference, so all three agree bit for bit. Host and device code.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>
#include <cstring>

namespace titan::float8::detail {

/// torchao's amax clamp: scales stay finite for an all-zero tensor.
inline constexpr double kAmaxEpsilon = 1e-12;
/// Sign and exponent bits of a float32: clearing the rest rounds a finite float down to a power of 2.
inline constexpr uint32_t kExponentMask = 0xFF800000u;

/// (1 / max(amax, 1e-12)) * fp8_max in float64 (torchao's `max / clamp(amax)`, which Python evaluates
/// as a reciprocal times max), rounded to float32; with power_of_2, finite scales are rounded down to a
/// power of 2 by clearing their mantissa. NaN amax gives a NaN scale.
C10_HOST_DEVICE inline float scale_of_amax(float amax, double fp8_max, bool power_of_2) {
  double a = static_cast<double>(amax);
  a = a < kAmaxEpsilon ? kAmaxEpsilon : a;  // NaN stays NaN (the comparison is false)
  float scale = static_cast<float>((1.0 / a) * fp8_max);
  if (power_of_2 && scale - scale == 0.0f) {  // finite
    uint32_t bits = 0;
    memcpy(&bits, &scale, sizeof(bits));
    bits &= kExponentMask;
    memcpy(&scale, &bits, sizeof(bits));
  }
  return scale;
}

}  // namespace titan::float8::detail
