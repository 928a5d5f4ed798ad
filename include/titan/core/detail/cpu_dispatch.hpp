// SPDX-License-Identifier: BSD-3-Clause
// Which build of a CPU kernel this machine runs: kernels compiled twice (portable and with -mavx2 -mfma
// -mf16c, as src/float8/cast_cpu_*.cpp and src/optim/adam_bf16_states_cpu_*.cpp are) pick the AVX2 one
// where the CPU has all three extensions.
#pragma once

#include <string>
#include <vector>

namespace titan::detail {

inline bool cpu_runs_avx2() {
#if defined(__x86_64__) || defined(_M_X64)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

/// The builds this CPU runs, widest first: {"avx2", "default"} or {"default"}.
inline std::vector<std::string> cpu_runnable_builds() {
  if (cpu_runs_avx2()) return {"avx2", "default"};
  return {"default"};
}

}  // namespace titan::detail
