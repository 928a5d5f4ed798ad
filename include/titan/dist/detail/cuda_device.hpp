// SPDX-License-Identifier: BSD-3-Clause
// The CUDA runtime's current device, behind titan's CUDA switch (src/cuda/cuda_device.cpp; the build
// without CUDA has a stub that refuses).
#pragma once

#include <cstdint>

namespace titan::dist::detail {

/// Makes `index` this thread's (and the process's default) current CUDA device.
void set_current_cuda_device(int64_t index);

}  // namespace titan::dist::detail
