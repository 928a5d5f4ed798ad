// SPDX-License-Identifier: BSD-3-Clause
// Counts the CPU allocations made on this thread (and by the autograd engine working for it) while
// in scope, through c10's memory-reporting hook, the one the profiler uses.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <memory>

namespace titan::test {

struct AllocationStats final : c10::MemoryReportingInfoBase {
  int64_t live = 0;     ///< bytes allocated minus freed since the tracker started
  int64_t peak = 0;     ///< highest `live`
  int64_t largest = 0;  ///< the largest single allocation
  bool memoryProfilingEnabled() const override { return true; }
  void reportMemoryUsage(void*, int64_t bytes, size_t, size_t, c10::Device) override {
    live += bytes;
    peak = std::max(peak, live);
    largest = std::max(largest, bytes);
  }
};

class TrackAllocations {
 public:
  TrackAllocations()
      : stats_(std::make_shared<AllocationStats>()), guard_(c10::DebugInfoKind::PROFILER_STATE, stats_) {}
  const AllocationStats& stats() const { return *stats_; }

 private:
  std::shared_ptr<AllocationStats> stats_;
  c10::DebugInfoGuard guard_;
};

}  // namespace titan::test
