// SPDX-License-Identifier: BSD-3-Clause
// float8::cast and its ATen reference: checks, allocation, and the choice of kernel (CPU capability
// or CUDA).
#include "titan/float8/cast.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include "cast_kernels.hpp"
#include "cast_output.hpp"
#include "titan/core/detail/cpu_dispatch.hpp"
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

/// The widest kernels this CPU runs (ATen's runtime dispatch idea, without its registry).
const detail::CpuCastKernels& widest_kernels() {
  static const detail::CpuCastKernels& chosen =
      titan::detail::cpu_runs_avx2() ? detail::cpu_cast_kernels_avx2() : detail::cpu_cast_kernels_default();
  return chosen;
}

Float8Tensor run_cpu_cast(const at::Tensor& x_in, const CastSpec& spec, bool transposed,
                          const detail::CpuCastKernels& k) {
  const detail::CastOutput o = detail::prepare_cast(x_in, spec, transposed);
  if (o.x.numel() == 0) return {.data = o.data, .scale = o.scale};
  if (transposed) {
    (o.rowwise ? k.rowwise_transposed : k.tensorwise_transposed)(o.args);
  } else {
    (o.rowwise ? k.rowwise : k.tensorwise)(o.args);
  }
  return {.data = o.data, .scale = o.scale};
}

void check_scale(const at::Tensor& scale, const char* where) {
  TITAN_CHECK_VALUE(scale.defined() && scale.numel() == 1 && scale.scalar_type() == at::kFloat,
                    "[titan::float8::{}] expected a one-element float32 scale, got {}.", where,
                    scale.defined()
                        ? fmt::format("{} elements of {}", scale.numel(), c10::toString(scale.scalar_type()))
                        : std::string("an undefined tensor"));
}

/// One request for the values of a cast.
struct ValuesRequest {
  ValuesLayout layout = ValuesLayout::kRows;
  bool divide = false;  // float(code) / scale (dequantized_values), not times 1 / scale (cast_values)
  at::Tensor scale{};   // a given tensorwise scale, or undefined
};

Float8Values run_cpu_values(const at::Tensor& x_in, const CastSpec& spec, const ValuesRequest& r,
                            const detail::CpuCastKernels& k, const char* where) {
  TITAN_CHECK_VALUE(x_in.is_cpu(), "[titan::float8::{}] expected a CPU tensor, got {}.", where, x_in.device().str());
  const bool rowwise = spec.scaling == Scaling::kRowwise;
  const at::Tensor x = x_in.dim() == 2 ? x_in.contiguous() : x_in.contiguous().view({1, -1});  // (R, C)
  const int64_t R = x.size(0);
  const int64_t C = x.size(1);
  const bool transposed = r.layout == ValuesLayout::kTransposed;
  const at::Tensor values = at::empty(transposed ? at::IntArrayRef{C, R} : x_in.sizes(),
                                      x.options().dtype(at::kFloat));  // x's shape or (C, R)
  detail::ValuesScales scales = detail::ValuesScales::kTensor;
  at::Tensor scale = at::empty({}, x.options().dtype(at::kFloat));  // (), (R, 1), (C, 1) or (1, C)
  if (rowwise && r.layout == ValuesLayout::kRows) {
    scales = detail::ValuesScales::kRow;
    scale = at::empty({R, 1}, x.options().dtype(at::kFloat));
  } else if (rowwise) {
    scales = detail::ValuesScales::kColumn;
    scale = at::empty(transposed ? at::IntArrayRef{C, 1} : at::IntArrayRef{1, C}, x.options().dtype(at::kFloat));
  }
  if (r.scale.defined()) {
    TITAN_CHECK_VALUE(!rowwise, "[titan::float8::{}] expected no given scale with rowwise scaling, got one.", where);
    check_scale(r.scale, where);
    scale.fill_(r.scale.reshape({}).cpu());
  }
  if (x.numel() == 0) {
    if (!r.scale.defined()) scale.fill_(detail::scale_of_amax(0.0f, float8_max(spec.dtype), spec.power_of_2_scales));
    return {.values = values, .scale = scale};
  }
  const detail::CastArgs args{
      .x = x.data_ptr(),
      .rows = R,
      .cols = C,
      .source = detail::source_of(x.scalar_type()),
      .target = spec.dtype == at::kFloat8_e5m2 ? detail::Target::kE5M2 : detail::Target::kE4M3FN,
      .power_of_2 = spec.power_of_2_scales,
      .scale = scale.mutable_data_ptr<float>(),
      .values = values.mutable_data_ptr<float>(),
      .values_scales = scales,
      .values_transposed = transposed,
      .divide = r.divide,
      .scale_given = r.scale.defined()};
  k.values(args);
  return {.values = values, .scale = scale};
}

void check_values_source(const at::Tensor& x, const CastSpec& spec, ValuesLayout layout, const char* where) {
  check_source(x, spec, layout != ValuesLayout::kRows || spec.scaling == Scaling::kRowwise, where);
}

ValuesLayout layout_of(bool transposed) { return transposed ? ValuesLayout::kTransposed : ValuesLayout::kRows; }

void check_tensorwise(const CastSpec& spec, const char* where) {
  TITAN_CHECK_VALUE(spec.scaling == Scaling::kTensorwise,
                    "[titan::float8::{}] expected tensorwise scaling, got rowwise. Use dequantized_values() for "
                    "rowwise scales.",
                    where);
}

const detail::CpuCastKernels& kernels_named(std::string_view build, const char* where) {
  TITAN_CHECK_VALUE(build == "default" || (build == "avx2" && titan::detail::cpu_runs_avx2()),
                    "[titan::float8::detail::{}] expected a build this CPU runs (default{}), got \"{}\".", where,
                    titan::detail::cpu_runs_avx2() ? ", avx2" : "", build);
  return build == "avx2" ? detail::cpu_cast_kernels_avx2() : detail::cpu_cast_kernels_default();
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

Float8Values cast_values(const at::Tensor& x, const CastSpec& spec, bool transposed, const at::Tensor& scale) {
  check_values_source(x, spec, layout_of(transposed), "cast_values");
  check_tensorwise(spec, "cast_values");
  return run_cpu_values(x, spec, {.layout = layout_of(transposed), .scale = scale}, widest_kernels(), "cast_values");
}

Float8Values dequantized_values(const at::Tensor& x, const CastSpec& spec, ValuesLayout layout) {
  check_values_source(x, spec, layout, "dequantized_values");
  return run_cpu_values(x, spec, {.layout = layout, .divide = true}, widest_kernels(), "dequantized_values");
}

Float8Tensor cast_transposed(const at::Tensor& x, const CastSpec& spec) {
  check_source(x, spec, true, "cast_transposed");
  if (x.is_cuda()) return detail::cuda_cast(x, spec, /*transposed=*/true);
  TITAN_CHECK_VALUE(x.is_cpu(), "[titan::float8::cast_transposed] expected a CPU or CUDA tensor, got {}.",
                    x.device().str());
  return run_cpu_cast(x, spec, /*transposed=*/true, widest_kernels());
}

at::Tensor tensor_amax(const at::Tensor& x) {
  TITAN_CHECK_VALUE(x.defined(), "[titan::float8::tensor_amax] expected a tensor, got an undefined one.");
  if (x.numel() == 0) return at::zeros({}, x.options().dtype(at::kFloat));
  return x.abs().max().to(at::kFloat);
}

Float8Tensor cast_with_scale(const at::Tensor& x, const at::Tensor& scale, at::ScalarType dtype) {
  check_source(x, {.dtype = dtype}, false, "cast_with_scale");
  check_scale(scale, "cast_with_scale");
  // The ops of reference::cast after its scale, which the fused kernels match bit for bit.
  const double max = float8_max(dtype);
  const at::Tensor s = scale.reshape({}).to(x.device());  // ()
  return {.data = x.to(at::kFloat).mul(s).clamp(-max, max).to(dtype).contiguous(), .scale = s};
}

namespace detail {

std::vector<std::string> cpu_kernel_builds() { return titan::detail::cpu_runnable_builds(); }

Float8Tensor cpu_cast(const at::Tensor& x, const CastSpec& spec, bool transposed, std::string_view build) {
  check_source(x, spec, transposed || spec.scaling == Scaling::kRowwise, "detail::cpu_cast");
  TITAN_CHECK_VALUE(x.is_cpu(), "[titan::float8::detail::cpu_cast] expected a CPU tensor, got {}.", x.device().str());
  return run_cpu_cast(x, spec, transposed, kernels_named(build, "cpu_cast"));
}

Float8Values cpu_cast_values(const at::Tensor& x, const CastSpec& spec, bool transposed, std::string_view build,
                             const at::Tensor& scale) {
  check_values_source(x, spec, layout_of(transposed), "detail::cpu_cast_values");
  check_tensorwise(spec, "detail::cpu_cast_values");
  return run_cpu_values(x, spec, {.layout = layout_of(transposed), .scale = scale},
                        kernels_named(build, "cpu_cast_values"), "detail::cpu_cast_values");
}

Float8Values cpu_dequantized_values(const at::Tensor& x, const CastSpec& spec, ValuesLayout layout,
                                    std::string_view build) {
  check_values_source(x, spec, layout, "detail::cpu_dequantized_values");
  return run_cpu_values(x, spec, {.layout = layout, .divide = true}, kernels_named(build, "cpu_dequantized_values"),
                        "detail::cpu_dequantized_values");
}

}  // namespace detail

at::Tensor to_float(const at::Tensor& data) {
  TITAN_CHECK_VALUE(is_float8(data.scalar_type()), "[titan::float8::to_float] expected float8 data, got {}.",
                    c10::toString(data.scalar_type()));
  if (!data.is_cpu()) return data.to(at::kFloat);
  // Keep the layout .to() keeps (a GEMM's bits can depend on its operands' layout).
  if (!data.is_contiguous()) {
    if (data.dim() == 2 && data.t().is_contiguous()) return to_float(data.t()).t();
    return data.to(at::kFloat);
  }
  // Every float8 value, widened once by ATen: the table is ATen's conversion, so the result is too.
  const at::Tensor table = at::arange(256, at::kByte).view(data.scalar_type()).to(at::kFloat);  // (256)
  const at::Tensor bytes = data.view(at::kByte);                                                // data's shape
  at::Tensor out = at::empty(data.sizes(), data.options().dtype(at::kFloat));                   // data's shape
  const float* lut = table.const_data_ptr<float>();
  const uint8_t* in = bytes.const_data_ptr<uint8_t>();
  float* dst = out.mutable_data_ptr<float>();
  at::parallel_for(0, data.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = lut[in[i]];
  });
  return out;
}

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

Float8Values dequantized_values(const at::Tensor& x, const CastSpec& spec, ValuesLayout layout) {
  check_values_source(x, spec, layout, "reference::dequantized_values");
  if (layout == ValuesLayout::kRows) {
    const Float8Tensor q = reference::cast(x, spec);
    return {.values = q.data.to(at::kFloat).div(q.scale), .scale = q.scale};
  }
  const Float8Tensor q = reference::cast_transposed(x, spec);  // (C, R), scales () or (C, 1)
  if (layout == ValuesLayout::kTransposed) return {.values = q.data.to(at::kFloat).div(q.scale), .scale = q.scale};
  // x's layout: the bytes made row-major (R, C) first, the scales a row (1, C), as the emulated GEMMs read them.
  const at::Tensor scale = spec.scaling == Scaling::kRowwise ? q.scale.t() : q.scale;
  return {.values = q.data.t().contiguous().to(at::kFloat).div(scale), .scale = scale};
}

Float8Values cast_values(const at::Tensor& x, const CastSpec& spec, bool transposed, const at::Tensor& scale) {
  check_values_source(x, spec, layout_of(transposed), "reference::cast_values");
  check_tensorwise(spec, "reference::cast_values");
  const at::Tensor source = transposed ? x.t() : x;
  const Float8Tensor q = scale.defined() ? cast_with_scale(source, scale, spec.dtype) : reference::cast(source, spec);
  return {.values = q.data.to(at::kFloat).mul(q.scale.reciprocal().item<float>()).contiguous(), .scale = q.scale};
}

Float8Tensor cast_transposed(const at::Tensor& x, const CastSpec& spec) {
  check_source(x, spec, true, "reference::cast_transposed");
  Float8Tensor t = reference::cast(x.t(), spec);
  return {.data = t.data.contiguous(), .scale = t.scale};
}

}  // namespace reference

}  // namespace titan::float8
