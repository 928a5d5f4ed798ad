// SPDX-License-Identifier: BSD-3-Clause
// Built without CUDA: no CUDA device can be current.
#include "titan/dist/detail/cuda_device.hpp"
#include "titan/core/error.hpp"

namespace titan::dist::detail {
void set_current_cuda_device(int64_t index) {
  TITAN_CHECK_NOT_IMPLEMENTED(false,
                              "[titan::dist::set_current_cuda_device] expected a build with CUDA to select GPU {}, got "
                              "one without (TITAN_ENABLE_CUDA=OFF). Rebuild with the CUDA toolkit present.",
                              index);
}
}  // namespace titan::dist::detail
