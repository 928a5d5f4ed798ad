// SPDX-License-Identifier: BSD-3-Clause
// The bf16-moment Adam kernel for any CPU: at::vec's portable Vectorized (compiled with the project's
// flags plus -ffp-contract=off; CMake defines CPU_CAPABILITY=DEFAULT for this file, as ATen does).
#define TITAN_ADAM_KERNELS_NS cpu_default
#include "adam_bf16_states_kernel.inc"

namespace titan::detail {
void adam_bf16_step_default(const AdamBf16Args& args) { cpu_default::step(args); }
}  // namespace titan::detail
