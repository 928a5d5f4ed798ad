// SPDX-License-Identifier: BSD-3-Clause
#include <c10/cuda/CUDAFunctions.h>

#include "titan/dist/detail/cuda_device.hpp"

namespace titan::dist::detail {
void set_current_cuda_device(int64_t index) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(index)); }
}  // namespace titan::dist::detail
