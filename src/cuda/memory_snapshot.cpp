// SPDX-License-Identifier: BSD-3-Clause
// The CUDA caching allocator's history and snapshot (torch.cuda.memory._record_memory_history and
// _snapshot), for profiling.enable_memory_snapshot.
#include <torch/csrc/cuda/memory_snapshot.h>

#include "titan/metrics/detail/cuda_memory_snapshot.hpp"

namespace titan::detail {

bool cuda_record_memory_history(bool on, size_t max_entries) {
  if (on) {
    torch::cuda::_record_memory_history(std::optional<std::string>("all"), std::optional<std::string>("all"), "all",
                                        max_entries);
  } else {
    torch::cuda::_record_memory_history(std::optional<std::string>(std::nullopt));
  }
  return true;
}

std::optional<std::string> cuda_memory_snapshot_pickled() { return torch::cuda::_memory_snapshot_pickled(); }

}  // namespace titan::detail
