// SPDX-License-Identifier: BSD-3-Clause
// Per-rank CPU memory accounting by category (parameters, gradients, optimizer state, activations,
// communication buffers): a tracker a rank installs on its thread, a tracking CPU allocator that books
// every allocation of that thread to it, and a thread-local category scope that the code making an
// allocation sets (FSDP's gathers and reductions tag theirs `communication`). Live and peak bytes per
// category; peaks restart per step. Ranks as threads each get their own figures. On CUDA the caching
// allocator's statistics are used instead (metrics/metrics.hpp); the planner that predicts these same
// parts is planner/memory_plan.hpp. See docs/memory_planner.md.
//
//   titan::MemoryTracker tracker;                    // this rank's
//   titan::TrackMemory track(tracker);               // this thread's CPU allocations book to it
//   { titan::MemoryScope s(titan::MemoryCategory::activations); loss = forward_backward(...); }
//   tracker.peak(titan::MemoryCategory::activations);
//
// With record_timeline(true) the tracker also keeps every booking in order (time, +/- bytes, category,
// running total): the CPU memory timeline that profiling.enable_memory_snapshot writes as JSON
// (metrics/profiler.hpp; the format is in docs/observability.md).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace at {
class Tensor;
}

namespace titan {

/// What a block of memory holds. `other` is whatever no scope named (model construction, data, ...).
enum class MemoryCategory : int { parameters = 0, gradients, optimizer, activations, communication, other };
inline constexpr int kNumMemoryCategories = 6;
/// "parameters", "gradients", "optimizer", "activations", "communication", "other".
std::string_view memory_category_name(MemoryCategory category);

/// One rank's memory by part, in bytes: what the planner predicts and the trainer reports.
struct MemoryParts {
  int64_t parameters = 0;     ///< the rank's parameter storages (local shards)
  int64_t gradients = 0;      ///< their gradients (and, under PP, the unsharded accumulation buffers)
  int64_t optimizer = 0;      ///< optimizer state (AdamW: exp_avg, exp_avg_sq, step counters)
  int64_t activations = 0;    ///< peak of the step's transient tensors (saved activations, their gradients, logits)
  int64_t communication = 0;  ///< peak of collective buffers (gathered FSDP units, reduce-scatter buffers)
  /// The sum of the parts: an upper bound of the peak, since the parts' peaks need not coincide.
  int64_t total() const { return parameters + gradients + optimizer + activations + communication; }
};

/// One booking of a tracker's timeline.
struct MemoryEvent {
  int64_t time_ns = 0;  ///< steady-clock nanoseconds since the timeline started
  int64_t bytes = 0;    ///< allocated (> 0) or freed (< 0)
  int category = 0;     ///< the MemoryCategory it was booked to
  int64_t total = 0;    ///< live bytes of all categories right after it
};

/// A tracker's bookings since record_timeline(true) or the last take_timeline().
struct MemoryTimeline {
  std::array<int64_t, kNumMemoryCategories> base{};  ///< live bytes per category before the first event
  int64_t start_unix_us = 0;                         ///< wall clock at time_ns 0 (microseconds since 1970)
  std::vector<MemoryEvent> events{};                 ///< in booking order (a free from another thread too)
  std::vector<std::pair<int64_t, int64_t>> steps{};  ///< (step, index of its first event) per mark_step()
  std::vector<int64_t> peak_resets{};                ///< index of the first event after each reset_peaks()
  bool truncated = false;                            ///< kMaxTimelineEvents reached: later bookings not kept
};

/// Live and peak CPU bytes per category of one rank. Thread-safe: frees may come from any thread.
class MemoryTracker {
 public:
  MemoryTracker();
  ~MemoryTracker();
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  /// Bytes allocated and not yet freed in `category`.
  int64_t live(MemoryCategory category) const;
  /// Highest live bytes in `category` since construction or the last reset_peaks().
  int64_t peak(MemoryCategory category) const;
  /// Live and peak bytes over all categories.
  int64_t live_total() const;
  int64_t peak_total() const;
  /// Restarts every peak at the current live bytes (once per step or per log).
  void reset_peaks();

  /// Starts (or stops) keeping every booking in a timeline; while on, bookings are serialised by a lock.
  void record_timeline(bool on);
  bool recording_timeline() const;
  /// Marks where step `step` begins in the timeline (nothing when not recording).
  void mark_step(int64_t step);
  /// The timeline so far; the next one starts here (its base = the live bytes now).
  MemoryTimeline take_timeline();
  /// Events kept per timeline at most (torchtitan keeps 100000 CUDA allocator entries).
  static constexpr int64_t kMaxTimelineEvents = 1000000;

  /// The counters, shared with the allocations booked to them (they may outlive the tracker).
  struct Counters;

 private:
  std::shared_ptr<Counters> counters_;
  friend class TrackMemory;
};

/// Installs the tracking allocator as c10's CPU allocator (once per process; later calls do nothing).
/// TrackMemory calls it. Allocations made on threads with no tracker pass through unbooked.
void install_memory_tracking();

/// While alive, this thread's CPU allocations are booked to `tracker` (and each free to the tracker
/// its allocation was booked to, whichever thread frees it). Nests; restores the previous tracker.
class TrackMemory {
 public:
  explicit TrackMemory(MemoryTracker& tracker);
  ~TrackMemory();
  TrackMemory(const TrackMemory&) = delete;
  TrackMemory& operator=(const TrackMemory&) = delete;

 private:
  std::shared_ptr<MemoryTracker::Counters> previous_;
};

/// While alive, this thread's tracked allocations are booked to `category`. Nests.
class MemoryScope {
 public:
  explicit MemoryScope(MemoryCategory category);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

 private:
  MemoryCategory previous_;
};

/// Moves the bytes of `tensor`'s storage to `category` (e.g. a gradient autograd allocated while the
/// step's activations were being booked). Does nothing for an untracked or undefined tensor.
void retag_memory(const at::Tensor& tensor, MemoryCategory category);

/// Books each of `params`' gradients to `gradients` as autograd accumulates it (a post-accumulate-grad
/// hook; parameters that already have one are left alone). Autograd allocates a gradient inside the
/// backward of the op that produces it, i.e. while the step's activations are being booked.
void book_gradients_on_accumulation(const std::vector<at::Tensor>& params);

/// Bytes of the distinct storages of `tensors` (a storage shared by several tensors counts once).
int64_t storage_bytes(const std::vector<at::Tensor>& tensors);

}  // namespace titan
