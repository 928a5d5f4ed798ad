// SPDX-License-Identifier: BSD-3-Clause
// The CPU cast kernels by build, for tests and benchmarks: float8::cast picks the widest build the CPU
// runs; these run a named one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "titan/float8/cast.hpp"

namespace titan::float8::detail {

/// The kernel builds this CPU runs, widest first: {"avx2", "default"} on AVX2 machines, else {"default"}.
std::vector<std::string> cpu_kernel_builds();

/// float8::cast (transposed = false) or float8::cast_transposed (true) with the named build.
Float8Tensor cpu_cast(const at::Tensor& x, const CastSpec& spec, bool transposed, std::string_view build);

/// float8::cast_values with the named build.
Float8Values cpu_cast_values(const at::Tensor& x, const CastSpec& spec, bool transposed, std::string_view build,
                             const at::Tensor& scale = {});

/// float8::dequantized_values with the named build.
Float8Values cpu_dequantized_values(const at::Tensor& x, const CastSpec& spec, ValuesLayout layout,
                                    std::string_view build);

}  // namespace titan::float8::detail
