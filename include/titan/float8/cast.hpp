// SPDX-License-Identifier: BSD-3-Clause
// float8 casts: amax -> scale -> saturated cast, tensorwise or rowwise, and the transposed cast the
// backward GEMMs need. `cast` runs titan's fused kernels (CPU: at::vec + at::parallel_for; CUDA:
// src/cuda/float8_cast.cu); `reference::cast` is the plain ATen twin they are tested against
// bit for bit. The numerics are torchao's (float8_utils.py): see docs/float8.md.
#pragma once

#include <ATen/core/Tensor.h>

namespace titan::float8 {

/// How many scales a cast computes.
enum class Scaling {
  kTensorwise,  ///< one scale for the whole tensor
  kRowwise,     ///< one scale per row of the result (torchao's axiswise scaling)
};

/// How a high-precision tensor becomes float8.
struct CastSpec {
  /// float8 dtype of the result: at::kFloat8_e4m3fn (weights, activations) or at::kFloat8_e5m2 (gradients).
  at::ScalarType dtype = at::kFloat8_e4m3fn;
  /// one scale, or one per row of the result
  Scaling scaling = Scaling::kTensorwise;
  /// round each scale down to a power of 2 (torchao's rowwise recipes)
  bool power_of_2_scales = false;
};

/// A float8 tensor with its scales: data = saturate(x * scale), so x ~= data / scale.
struct Float8Tensor {
  at::Tensor data{};   ///< (R, C) float8, row-major
  at::Tensor scale{};  ///< float32: () tensorwise, (R, 1) rowwise
  /// data / scale in `dtype` (float32 arithmetic, as torchao's emulated GEMMs do).
  at::Tensor dequantize(at::ScalarType dtype = at::kFloat) const;
};

/// The largest finite value of a float8 dtype (448 for e4m3fn, 57344 for e5m2).
double float8_max(at::ScalarType dtype);
/// Whether `dtype` is one of the float8 dtypes titan casts to (e4m3fn, e5m2).
bool is_float8(at::ScalarType dtype);

/// scale = float8_max / max(amax, 1e-12) in float64, rounded to float32 (and down to a power of 2
/// when asked). `amax` is any float tensor; the result has its shape.
at::Tensor amax_to_scale(const at::Tensor& amax, const CastSpec& spec);

/// x (R, C) -> float8 (R, C): one amax pass and one cast pass (tensorwise), or one pass per row
/// (rowwise: amax, scale and cast while the row is in cache). Tensorwise accepts any shape.
/// x: float32, bfloat16 or float16, on CPU or CUDA.
Float8Tensor cast(const at::Tensor& x, const CastSpec& spec);

/// x (R, C) -> float8 of x^T, laid out (C, R) row-major; rowwise scales are per column of x, (C, 1).
/// The operand layouts the backward GEMMs need (grad_output^T, input^T, weight^T).
Float8Tensor cast_transposed(const at::Tensor& x, const CastSpec& spec);

/// max |x| over the whole tensor, () float32 (torchao's tensor_to_amax, tensorwise). An empty x gives 0.
at::Tensor tensor_amax(const at::Tensor& x);

/// x -> float8 with a given tensorwise scale () float32, e.g. one from the amax of a larger tensor x
/// is a shard of (torchao's hp_tensor_and_scale_to_float8): data = saturate(x * scale), bit for bit
/// what `cast` gives the whole tensor when `scale` is its scale. Any shape; CPU or CUDA.
Float8Tensor cast_with_scale(const at::Tensor& x, const at::Tensor& scale, at::ScalarType dtype);

/// float8 data (any shape, CPU) -> float32, bit for bit what `data.to(at::kFloat)` gives (NaN payloads
/// included), by a 256-entry table: ATen's CPU conversion is per element and ~30 M elements/s, which made
/// the CPU float8 GEMMs' operand widening cost more than the GEMMs. Other devices: `data.to(at::kFloat)`.
at::Tensor to_float(const at::Tensor& data);

/// A tensorwise float8 cast seen as the float32 values a GEMM reads: values = float(data) * (1 / scale).
struct Float8Values {
  at::Tensor values{};  ///< float32: x's shape, or (C, R) row-major when transposed
  at::Tensor scale{};   ///< () float32, the scale `cast` gives x
};

/// Bit for bit `to_float(cast(x).data) * reciprocal(scale)` (or of cast_transposed), in one amax pass and
/// one pass over x with no float8 bytes in between: the operand of a float8 GEMM on a CPU, where ATen's
/// `_scaled_mm` widens each operand so and runs a float32 GEMM. Tensorwise scaling only; x: float32,
/// bfloat16 or float16 on CPU, 2-D when transposed. `scale`, a () float32 tensor, replaces x's own and
/// skips the amax pass (the values are then those of cast_with_scale): e.g. the scale an earlier cast of
/// the same x computed.
Float8Values cast_values(const at::Tensor& x, const CastSpec& spec, bool transposed = false,
                         const at::Tensor& scale = {});

/// Which cast dequantized_values takes the values of, and their layout.
enum class ValuesLayout {
  kRows,        ///< of cast(x, spec): (R, C); one scale, or one per row of x
  kTransposed,  ///< of cast_transposed(x, spec): (C, R); one scale, or one per column of x
  kColumns,     ///< of cast_transposed(x, spec), laid out as x: (R, C) row-major; one scale, or (1, C)
};

/// Bit for bit `to_float(q.data).div(q.scale)` for q the cast `layout` names, the kColumns bytes made
/// row-major first and their scales a row: the operands of the emulated float8 GEMMs (torchao's
/// emulation, and rowwise scales on CPU), in the layouts those GEMMs read, from x in one pass per scale
/// kind (an amax pass for tensorwise and per-column scales; a row's amax while it is in cache). x:
/// float32, bfloat16 or float16 on CPU; 2-D unless tensorwise kRows.
Float8Values dequantized_values(const at::Tensor& x, const CastSpec& spec, ValuesLayout layout = ValuesLayout::kRows);

namespace reference {
/// The plain ATen twin of float8::dequantized_values.
Float8Values dequantized_values(const at::Tensor& x, const CastSpec& spec, ValuesLayout layout = ValuesLayout::kRows);
/// The plain ATen twin of float8::cast_values: reference::cast (or cast_transposed), widened, times
/// the reciprocal scale.
Float8Values cast_values(const at::Tensor& x, const CastSpec& spec, bool transposed = false,
                         const at::Tensor& scale = {});
/// The plain ATen twin of float8::cast: torchao's ops, one by one.
Float8Tensor cast(const at::Tensor& x, const CastSpec& spec);
/// The plain ATen twin of float8::cast_transposed: reference::cast(x^T), made contiguous.
Float8Tensor cast_transposed(const at::Tensor& x, const CastSpec& spec);
}  // namespace reference

}  // namespace titan::float8
