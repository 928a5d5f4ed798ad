// SPDX-License-Identifier: BSD-3-Clause
#include "titan/dist/local_ranks.hpp"

#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"

namespace titan::dist {

void run_local_ranks(int64_t world_size, const std::function<void(int64_t rank, const Store& store)>& fn) {
  TITAN_CHECK_VALUE(world_size >= 1, "[titan::dist::run_local_ranks] expected world_size >= 1, got {}.", world_size);
  // c10d's flight recorder is one per process and assumes one rank per process: ranks as threads
  // would race on it (seen as crashes in FlightRecorder::record). It only serves post-mortem dumps.
  setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/1);
  const Store store = Store::in_memory();
  std::mutex mutex;
  std::string first_error;
  int64_t failed_rank = -1;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world_size));
  for (int64_t rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank, store);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        if (failed_rank < 0) {
          failed_rank = rank;
          first_error = error_message(e);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  TITAN_CHECK(failed_rank < 0, "[titan::dist::run_local_ranks] rank {} of {} failed: {}", failed_rank, world_size,
              first_error);
}

}  // namespace titan::dist
