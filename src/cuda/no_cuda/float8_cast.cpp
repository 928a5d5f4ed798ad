// SPDX-License-Identifier: BSD-3-Clause
// Built without CUDA: float8 casts of CUDA tensors are not available.
#include "titan/core/error.hpp"
#include "titan/float8/detail/cuda_cast.hpp"

namespace titan::float8::detail {
Float8Tensor cuda_cast(const at::Tensor&, const CastSpec&, bool) {
  TITAN_CHECK_NOT_IMPLEMENTED(false,
                              "[titan::float8::cast] titan was built without CUDA (TITAN_ENABLE_CUDA=OFF): no float8 "
                              "kernels for CUDA tensors. Rebuild with nvcc present, or cast a CPU tensor.");
  return {};
}
}  // namespace titan::float8::detail
