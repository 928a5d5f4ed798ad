// SPDX-License-Identifier: BSD-3-Clause
// CUDA caching-allocator statistics for the metrics line (torchtitan's max_active / max_reserved).
#include "titan/metrics/detail/device_memory.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

namespace titan::detail {

std::optional<MemoryStats> cuda_memory_stats(int device_index) {
  using c10::CachingDeviceAllocator::StatType;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_index);
  const auto all = static_cast<size_t>(StatType::AGGREGATE);
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return MemoryStats{.max_active = stats.active_bytes[all].peak,
                     .max_reserved = stats.reserved_bytes[all].peak,
                     .capacity = static_cast<int64_t>(total_bytes),
                     .num_alloc_retries = stats.num_alloc_retries,
                     .num_ooms = stats.num_ooms};
}

void cuda_reset_peak_memory(int device_index) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_index));
}

std::optional<std::string> cuda_device_name(int device_index) {
  cudaDeviceProp prop{};
  C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  return std::string(prop.name);
}

}  // namespace titan::detail
