// SPDX-License-Identifier: BSD-3-Clause
// N ranks as threads of one process, sharing an in-memory store: the fast way to run multi-rank
// code in tests, benchmarks and notebooks-in-C++ without a launcher. Each thread is one rank with its
// own Mesh, model and optimizer; only the intra-op thread pool is shared.
#pragma once

#include <cstdint>
#include <functional>

#include "titan/dist/store.hpp"

namespace titan::dist {

/// Runs fn(rank, store) on world_size threads and joins them. If ranks throw, rethrows the first
/// error prefixed with its rank (the others usually fail next with a timeout: keep timeouts short).
/// Turns off c10d's per-process flight recorder (TORCH_FR_BUFFER_SIZE=0): it assumes one rank per process.
void run_local_ranks(int64_t world_size, const std::function<void(int64_t rank, const Store& store)>& fn);

}  // namespace titan::dist
