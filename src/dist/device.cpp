// SPDX-License-Identifier: BSD-3-Clause
#include "titan/dist/device.hpp"

#include <ATen/Context.h>

#include "titan/core/error.hpp"
#include "titan/dist/detail/cuda_device.hpp"

namespace titan::dist {

int64_t rank_device_index(int64_t local_rank, int64_t visible_gpus) {
  if (visible_gpus <= 0) return -1;
  TITAN_CHECK_VALUE(local_rank >= 0 && local_rank < visible_gpus,
                    "[titan::dist::select_rank_device] expected LOCAL_RANK in [0, {}) (one GPU per rank), got {}. "
                    "Start as many ranks per node as it has GPUs (--nproc-per-node {}), or make more visible "
                    "(CUDA_VISIBLE_DEVICES).",
                    visible_gpus, local_rank, visible_gpus);
  return local_rank;
}

at::Device select_rank_device(int64_t local_rank) {
  const int64_t index = rank_device_index(local_rank, at::hasCUDA() ? at::getNumGPUs() : 0);
  if (index < 0) return at::Device(at::kCPU);
  detail::set_current_cuda_device(index);
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace titan::dist
