// SPDX-License-Identifier: BSD-3-Clause
// Built without CUDA: no allocator statistics (callers fall back to process memory).
#include "titan/metrics/detail/device_memory.hpp"

namespace titan::detail {
std::optional<MemoryStats> cuda_memory_stats(int) { return std::nullopt; }
void cuda_reset_peak_memory(int) {}
std::optional<std::string> cuda_device_name(int) { return std::nullopt; }
}  // namespace titan::detail
