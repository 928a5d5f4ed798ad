// SPDX-License-Identifier: BSD-3-Clause
// Backend hook for the CUDA caching allocator's memory history and snapshot: implemented in src/cuda/
// when titan is built with CUDA, and by a stub that reports "unavailable" otherwise.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace titan::detail {
/// Starts (keeping up to `max_entries` alloc/free events with C++ stacks) or stops recording the
/// allocator's history, as torch.cuda.memory._record_memory_history; false when built without CUDA.
bool cuda_record_memory_history(bool on, size_t max_entries);
/// torch.cuda.memory._snapshot() pickled (what PyTorch's memory viewer opens); nullopt without CUDA.
std::optional<std::string> cuda_memory_snapshot_pickled();
}  // namespace titan::detail
