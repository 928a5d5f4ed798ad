// SPDX-License-Identifier: BSD-3-Clause
// Backend hook for CUDA allocator statistics: implemented in src/cuda/ when titan is built with
// CUDA, and by a stub that reports "unavailable" otherwise.
#pragma once

#include <optional>

#include "titan/metrics/metrics.hpp"

namespace titan::detail {
std::optional<MemoryStats> cuda_memory_stats(int device_index);
void cuda_reset_peak_memory(int device_index);
std::optional<std::string> cuda_device_name(int device_index);
}  // namespace titan::detail
