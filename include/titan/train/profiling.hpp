// SPDX-License-Identifier: BSD-3-Clause
// Profiling: what watches a training step's cost without changing its numbers: the profiler's trace windows
// (profiling.enable_profiling), memory snapshots (profiling.enable_memory_snapshot, and one at an out-of-memory
// failure) and, on CPU, this rank's memory tracker, which books every allocation of a step to its part
// (parameters, gradients, optimizer state, activations, communication buffers) for the metrics and titan-plan's
// comparison. A loop runs each step inside step():
//
//   titan::Profiling profiling(run, model.parameters());
//   profiling.step(step, [&] { ... one step ... });
//   titan::MemoryParts parts = profiling.memory_parts(model.parameters(), optimizer);
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "titan/core/memory_tracker.hpp"

namespace titan {
class RunContext;
class Optimizer;
class Profiler;
class MemorySnapshotter;

class Profiling {
 public:
  /// The profiler and snapshotter profiling.* asks for, under the run folder; on CPU a memory tracker whose
  /// gradients bucket gets `parameters`' gradients as they accumulate.
  Profiling(const RunContext& run, const std::vector<at::Tensor>& parameters);
  ~Profiling();
  Profiling(const Profiling&) = delete;
  Profiling& operator=(const Profiling&) = delete;

  /// Runs `work` (step `step`) inside the profiler's and snapshotter's step marks, its allocations booked to the
  /// tracker; an out-of-memory error becomes titan's, naming the step and where the failure's snapshot went.
  void step(int64_t step, const std::function<void()>& work);
  /// This rank's memory by part: parameters, gradients and optimizer state from the tensors; activations and
  /// communication buffers as their peaks since the last call (CPU: the tracker; CUDA: activations = the allocator's
  /// peak less the rest, communication not split out). Restarts the peaks.
  MemoryParts memory_parts(const std::vector<at::Tensor>& parameters, const Optimizer& optimizer);
  /// Saves a trace window cut short by the end of the run at `last_step`.
  void finish(int64_t last_step);

 private:
  const RunContext& run_;
  std::unique_ptr<MemoryTracker> tracker_;  // CPU: this rank's allocations by part during steps
  std::unique_ptr<Profiler> profiler_;
  std::unique_ptr<MemorySnapshotter> snapshotter_;
};

}  // namespace titan
