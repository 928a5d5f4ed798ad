// SPDX-License-Identifier: BSD-3-Clause
// float8::cast for CUDA tensors: the shared allocation (src/float8/cast_output.hpp) on the tensor's
// device and stream, then the kernels of float8_cast_kernels.cu.
#include "float8_cast.hpp"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../float8/cast_output.hpp"
#include "titan/float8/detail/cuda_cast.hpp"

namespace titan::float8::detail {

Float8Tensor cuda_cast(const at::Tensor& x_in, const CastSpec& spec, bool transposed) {
  c10::cuda::CUDAGuard guard(x_in.device());
  const CastOutput o = prepare_cast(x_in, spec, transposed);
  if (o.x.numel() == 0) return {.data = o.data, .scale = o.scale};
  const int64_t amaxes = o.rowwise && transposed ? o.args.cols : 1;
  at::Tensor amax = at::zeros({amaxes}, o.x.options().dtype(at::kFloat));  // (amaxes) scratch
  launch_cuda_cast(o.args, o.rowwise, transposed, amax.data_ptr<float>(), c10::cuda::getCurrentCUDAStream().stream());
  return {.data = o.data, .scale = o.scale};
}

}  // namespace titan::float8::detail
