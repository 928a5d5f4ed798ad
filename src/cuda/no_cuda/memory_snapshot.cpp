// SPDX-License-Identifier: BSD-3-Clause
// Built without CUDA: no allocator history (a CUDA memory snapshot is refused with a message).
#include "titan/metrics/detail/cuda_memory_snapshot.hpp"

namespace titan::detail {
bool cuda_record_memory_history(bool, size_t) { return false; }
std::optional<std::string> cuda_memory_snapshot_pickled() { return std::nullopt; }
}  // namespace titan::detail
