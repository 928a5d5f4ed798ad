// SPDX-License-Identifier: BSD-3-Clause
// float8::cast for CUDA tensors: allocation on the tensor's device and stream, then the kernels of
// float8_cast_kernels.cu.
#include "float8_cast.hpp"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "titan/float8/detail/cuda_cast.hpp"

namespace titan::float8::detail {

Float8Tensor cuda_cast(const at::Tensor& x_in, const CastSpec& spec, bool transposed) {
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.dim() == 2 ? x_in.contiguous() : x_in.contiguous().view({1, -1});  // (R, C)
  const int64_t R = x.size(0);
  const int64_t C = x.size(1);
  const bool rowwise = spec.scaling == Scaling::kRowwise;
  at::Tensor data = at::empty(transposed ? at::IntArrayRef{C, R} : x_in.sizes(), x.options().dtype(spec.dtype));
  const int64_t scales = rowwise ? (transposed ? C : R) : 1;
  at::Tensor scale = at::empty(rowwise ? at::IntArrayRef{scales, 1} : at::IntArrayRef{}, x.options().dtype(at::kFloat));
  at::Tensor amax = at::zeros({rowwise && transposed ? C : 1}, x.options().dtype(at::kFloat));  // scratch
  const auto source = x.scalar_type() == at::kBFloat16 ? Source::kBFloat16
                      : x.scalar_type() == at::kHalf   ? Source::kHalf
                                                       : Source::kFloat;
  const CastArgs args{.x = x.data_ptr(),
                      .rows = R,
                      .cols = C,
                      .source = source,
                      .target = spec.dtype == at::kFloat8_e5m2 ? Target::kE5M2 : Target::kE4M3FN,
                      .power_of_2 = spec.power_of_2_scales,
                      .out = static_cast<uint8_t*>(data.data_ptr()),
                      .scale = scale.data_ptr<float>()};
  if (x.numel() == 0) {
    return {.data = data, .scale = amax_to_scale(at::zeros_like(scale), spec)};  // amax of nothing: 0
  }
  launch_cuda_cast(args, rowwise, transposed, amax.data_ptr<float>(), c10::cuda::getCurrentCUDAStream().stream());
  return {.data = data, .scale = scale};
}

}  // namespace titan::float8::detail
