// SPDX-License-Identifier: BSD-3-Clause
// The harness of the planner-against-tracker tests: every rank of a CPU layout (ranks as threads over Gloo)
// measures its parts, and a planned figure is compared with a measured one as a ratio.
#pragma once

#include <chrono>
#include <mutex>
#include <vector>

#include "test_util.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"

namespace titan::test {

/// measure_rank(mesh) on every rank of `shape`, in rank order.
template <class MeasureRank>
std::vector<MemoryParts> measure_ranks(const dist::MeshShape& shape, const MeasureRank& measure_rank) {
  std::vector<MemoryParts> out(static_cast<size_t>(shape.world_size()));
  std::mutex mutex;
  dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(
        shape, rank, store,
        {.init_timeout = patience(std::chrono::seconds(120)), .timeout = patience(std::chrono::seconds(120))});
    const MemoryParts parts = measure_rank(mesh);
    const std::lock_guard lock(mutex);
    out[static_cast<size_t>(rank)] = parts;
  });
  return out;
}

/// planned / measured (1 when both are 0).
inline double ratio(int64_t planned, int64_t measured) {
  return measured == 0 ? (planned == 0 ? 1.0 : 0.0) : static_cast<double>(planned) / static_cast<double>(measured);
}

}  // namespace titan::test
