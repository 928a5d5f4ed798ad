// SPDX-License-Identifier: BSD-3-Clause
// The benchmarks' one timing rule: the median of `iters` runs after one warm-up run.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

namespace titan::bench {

/// Median seconds of `iters` runs of f (after one warm-up run).
inline double median_seconds(int64_t iters, const std::function<void()>& f) {
  f();
  std::vector<double> times;
  for (int64_t i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace titan::bench
