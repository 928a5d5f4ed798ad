// SPDX-License-Identifier: BSD-3-Clause
// The float8 cast kernels for any x86-64/ARM CPU: at::vec's portable Vectorized (compiled with the
// project's flags; CMake defines CPU_CAPABILITY=DEFAULT for this file, as ATen does for its own).
#define TITAN_FLOAT8_KERNELS_NS cpu_default
#define TITAN_FLOAT8_KERNELS_NAME "default"
#include "cast_kernels.inc"

namespace titan::float8::detail {
const CpuCastKernels& cpu_cast_kernels_default() { return cpu_default::kernels(); }
}  // namespace titan::float8::detail
