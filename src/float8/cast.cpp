// SPDX-License-Identifier: BSD-3-Clause
// float8::cast and its ATen reference: checks, allocation, and the choice of kernel (CPU capability
// or CUDA).
#include "titan/float8/cast.hpp"

#include <ATen/ATen.h>

#include "cast_kernels.hpp"
#include "titan/core/error.hpp"
#include "titan/float8/detail/cpu_cast.hpp"
#include "titan/float8/detail/cuda_cast.hpp"
#include "titan/float8/detail/scale.hpp"

namespace titan::float8 {
namespace {

void check_source(const at::Tensor& x, const CastSpec& spec, bool two_d, const char* where) {
  TITAN_CHECK_VALUE(x.defined(), "[titan::float8::{}] expected a tensor, got an undefined one.", where);
  const auto t = x.scalar_type();
  TITAN_CHECK_VALUE(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf,
                    "[titan::float8::{}] expected a float32, bfloat16 or float16 tensor, got {}.", where,
                    c10::toString(t));
  TITAN_CHECK_VALUE(is_float8(spec.dtype),
                    "[titan::float8::{}] expected CastSpec.dtype Float8_e4m3fn or Float8_e5m2, got {}.", where,
                    c10::toString(spec.dtype));
  TITAN_CHECK_VALUE(!two_d || x.dim() == 2, "[titan::float8::{}] expected a 2-D tensor (rows, cols), got {} dims.",
                    where, x.dim());
}

detail::Source source_of(at::ScalarType t) {
  if (t == at::kBFloat16) return detail::Source::kBFloat16;
  if (t == at::kHalf) return detail::Source::kHalf;
  return detail::Source::kFloat;
}

bool cpu_runs_avx2() {
#if defined(__x86_64__) || defined(_M_X64)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

/// The widest kernels this CPU runs (ATen's runtime dispatch idea, without its registry).
const detail::CpuCastKernels& widest_kernels() {
  static const detail::CpuCastKernels& chosen =
      cpu_runs_avx2() ? detail::cpu_cast_kernels_avx2() : detail::cpu_cast_kernels_default();
  return chosen;
}

Float8Tensor run_cpu_cast(const at::Tensor& x_in, const CastSpec& spec, bool transposed,
                          const detail::CpuCastKernels& k) {
  const at::Tensor x = x_in.dim() == 2 ? x_in.contiguous() : x_in.contiguous().view({1, -1});  // (R, C)
  const int64_t R = x.size(0);
  const int64_t C = x.size(1);
  const bool rowwise = spec.scaling == Scaling::kRowwise;
  at::Tensor data = at::empty(transposed ? at::IntArrayRef{C, R} : x_in.sizes(), x.options().dtype(spec.dtype));
  const int64_t scales = rowwise ? (transposed ? C : R) : 1;
  at::Tensor scale = at::empty(rowwise ? at::IntArrayRef{scales, 1} : at::IntArrayRef{}, x.options().dtype(at::kFloat));
  const detail::CastArgs args{
      .x = x.data_ptr(),
      .rows = R,
      .cols = C,
      .source = source_of(x.scalar_type()),
      .target = spec.dtype == at::kFloat8_e5m2 ? detail::Target::kE5M2 : detail::Target::kE4M3FN,
      .power_of_2 = spec.power_of_2_scales,
      .out = static_cast<uint8_t*>(data.data_ptr()),
      .scale = scale.data_ptr<float>()};
  if (x.numel() == 0) {
    scale.fill_(detail::scale_of_amax(0.0f, float8_max(spec.dtype), spec.power_of_2_scales));
    return {.data = data, .scale = scale};
  }
  if (transposed) {
    (rowwise ? k.rowwise_transposed : k.tensorwise_transposed)(args);
  } else {
    (rowwise ? k.rowwise : k.tensorwise)(args);
  }
  return {.data = data, .scale = scale};
}

}  // namespace

double float8_max(at::ScalarType dtype) {
  if (dtype == at::kFloat8_e4m3fn) return 448.0;
  if (dtype == at::kFloat8_e5m2) return 57344.0;
  TITAN_CHECK_VALUE(false, "[titan::float8] expected Float8_e4m3fn or Float8_e5m2, got {}.", c10::toString(dtype));
  return 0.0;
}

bool is_float8(at::ScalarType dtype) { return dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2; }

at::Tensor Float8Tensor::dequantize(at::ScalarType dtype) const { return data.to(at::kFloat).div(scale).to(dtype); }

at::Tensor amax_to_scale(const at::Tensor& amax, const CastSpec& spec) {
  at::Tensor scale = amax.to(at::kDouble).clamp_min(detail::kAmaxEpsilon).reciprocal().mul(float8_max(spec.dtype));
  scale = scale.to(at::kFloat);
  if (spec.power_of_2_scales) {
    const at::Tensor floored =
        scale.view(at::kInt).bitwise_and(static_cast<int32_t>(detail::kExponentMask)).view(at::kFloat);
    scale = at::where(at::isfinite(scale), floored, scale);
  }
  return scale;
}

Float8Tensor cast(const at::Tensor& x, const CastSpec& spec) {
  check_source(x, spec, spec.scaling == Scaling::kRowwise, "cast");
  if (x.is_cuda()) return detail::cuda_cast(x, spec, /*transposed=*/false);
  TITAN_CHECK_VALUE(x.is_cpu(), "[titan::float8::cast] expected a CPU or CUDA tensor, got {}.", x.device().str());
  return run_cpu_cast(x, spec, /*transposed=*/false, widest_kernels());
}

Float8Tensor cast_transposed(const at::Tensor& x, const CastSpec& spec) {
  check_source(x, spec, true, "cast_transposed");
  if (x.is_cuda()) return detail::cuda_cast(x, spec, /*transposed=*/true);
  TITAN_CHECK_VALUE(x.is_cpu(), "[titan::float8::cast_transposed] expected a CPU or CUDA tensor, got {}.",
                    x.device().str());
  return run_cpu_cast(x, spec, /*transposed=*/true, widest_kernels());
}

namespace detail {

std::vector<std::string> cpu_kernel_builds() {
  if (cpu_runs_avx2()) return {"avx2", "default"};
  return {"default"};
}

Float8Tensor cpu_cast(const at::Tensor& x, const CastSpec& spec, bool transposed, std::string_view build) {
  check_source(x, spec, transposed || spec.scaling == Scaling::kRowwise, "detail::cpu_cast");
  TITAN_CHECK_VALUE(x.is_cpu(), "[titan::float8::detail::cpu_cast] expected a CPU tensor, got {}.", x.device().str());
  TITAN_CHECK_VALUE(build == "default" || (build == "avx2" && cpu_runs_avx2()),
                    "[titan::float8::detail::cpu_cast] expected a build this CPU runs (default{}), got \"{}\".",
                    cpu_runs_avx2() ? ", avx2" : "", build);
  return run_cpu_cast(x, spec, transposed, build == "avx2" ? cpu_cast_kernels_avx2() : cpu_cast_kernels_default());
}

}  // namespace detail

namespace reference {

Float8Tensor cast(const at::Tensor& x, const CastSpec& spec) {
  check_source(x, spec, spec.scaling == Scaling::kRowwise, "reference::cast");
  // torchao: tensor_to_amax, amax_to_scale, hp_tensor_and_scale_to_float8, to_fp8_saturated.
  const at::Tensor amax = spec.scaling == Scaling::kRowwise ? x.abs().amax({-1}, /*keepdim=*/true) : x.abs().max();
  const at::Tensor scale = amax_to_scale(amax, spec);
  const double max = float8_max(spec.dtype);
  const at::Tensor data = x.to(at::kFloat).mul(scale).clamp(-max, max).to(spec.dtype);
  return {.data = data.contiguous(), .scale = scale};
}

Float8Tensor cast_transposed(const at::Tensor& x, const CastSpec& spec) {
  check_source(x, spec, true, "reference::cast_transposed");
  Float8Tensor t = reference::cast(x.t(), spec);
  return {.data = t.data.contiguous(), .scale = t.scale};
}

}  // namespace reference

}  // namespace titan::float8
