// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/profiling.hpp"

#include <ATen/ATen.h>

#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/metrics/metrics.hpp"
#include "titan/metrics/profiler.hpp"
#include "titan/optim/optimizer.hpp"
#include "titan/train/run_context.hpp"

namespace titan {

Profiling::Profiling(const RunContext& run, const std::vector<at::Tensor>& parameters) : run_(run) {
  if (!run.device().is_cuda()) {
    tracker_ = std::make_unique<MemoryTracker>();
    book_gradients_on_accumulation(parameters);
  }
  const ProfilingConfig& profiling = run.config().profiling;
  if (profiling.enable_profiling) {
    profiler_ = std::make_unique<Profiler>(Profiler::Options{.folder = run.run_folder() / profiling.save_traces_folder,
                                                             .rank = run.mesh().rank(),
                                                             .freq = profiling.profile_freq,
                                                             .warmup = profiling.profiler_warmup,
                                                             .active = profiling.profiler_active,
                                                             .cuda = run.device().is_cuda()});
  }
  if (profiling.enable_memory_snapshot) {
    snapshotter_ = std::make_unique<MemorySnapshotter>(
        MemorySnapshotter::Options{.folder = run.run_folder() / profiling.save_memory_snapshot_folder,
                                   .rank = run.mesh().rank(),
                                   .freq = profiling.profile_freq,
                                   .device = run.device(),
                                   .tracker = tracker_.get()});
  }
}

Profiling::~Profiling() = default;

void Profiling::step(int64_t step, const std::function<void()>& work) {
  if (profiler_) profiler_->begin_step(step);
  if (snapshotter_) snapshotter_->begin_step(step);
  try {
    // CPU: this step's allocations on this thread are booked to the rank's tracker (by part).
    std::optional<TrackMemory> track;
    if (tracker_) track.emplace(*tracker_);
    work();
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    // torchtitan's exit snapshot: the memory at the failure, for PyTorch's viewer (CUDA) or titan's JSON.
    std::string where = "turn on profiling.enable_memory_snapshot for a snapshot of the next failure";
    if (snapshotter_) where = "memory snapshot in " + snapshotter_->write_on_failure(step).string();
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     fmt::format("[titan::Trainer] out of memory at step {} ({}); {}. Lower "
                                 "training.local_batch_size or seq_len, or raise parallelism or activation "
                                 "checkpointing.",
                                 step, error_message(e), where));
  }
  if (profiler_) profiler_->end_step(step);
  if (snapshotter_) snapshotter_->end_step(step);
}

MemoryParts Profiling::memory_parts(const std::vector<at::Tensor>& parameters, const Optimizer& optimizer) {
  MemoryParts parts{.parameters = storage_bytes(parameters), .optimizer = optimizer.state_bytes()};
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters) grads.push_back(p.grad());
  parts.gradients = storage_bytes(grads);
  if (tracker_) {
    parts.activations = tracker_->peak(MemoryCategory::activations);
    parts.communication = tracker_->peak(MemoryCategory::communication);
    tracker_->reset_peaks();
  } else if (run_.device().is_cuda()) {
    const MemoryStats stats = memory_stats(run_.device());
    parts.activations = std::max<int64_t>(0, stats.max_active - parts.parameters - parts.gradients - parts.optimizer);
  }
  return parts;
}

void Profiling::finish(int64_t last_step) {
  if (profiler_) profiler_->finish(last_step);
}

}  // namespace titan
