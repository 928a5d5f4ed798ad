// SPDX-License-Identifier: BSD-3-Clause
// torchtitan's profiling.* for C++: per-rank Chrome traces on torchtitan's schedule, and per-rank
// memory snapshots (the CUDA caching allocator's history as the pickle PyTorch's memory viewer opens;
// on CPU titan's allocation timeline as JSON). File layout as torchtitan's:
//   <dump_folder>/<save_traces_folder>/iteration_<step>/rank<r>_trace.json
//   <dump_folder>/<save_memory_snapshot_folder>/iteration_<step>/rank<r>_memory_snapshot.{pickle,json}
// See docs/observability.md (turning them on, the formats, opening them).
//
//   titan::Profiler profiler({.folder = dump / "profile_traces", .rank = rank});
//   for (int64_t step = 1; step <= steps; ++step) {
//     profiler.begin_step(step);
//     train_step();
//     profiler.end_step(step);   // saves after steps that end a cycle (step % freq == 0)
//   }
//   profiler.finish(steps);      // saves a cycle the run ended inside
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "titan/core/memory_tracker.hpp"

namespace titan {

/// What the profiler does during a step (torchtitan's torch.profiler.schedule).
enum class ProfilerPhase { idle, warmup, active };

/// The phase of step `step` (1-based): each cycle of `freq` steps waits freq - warmup - active steps,
/// warms up for `warmup` and records `active`, so the recorded steps end at a multiple of `freq`;
/// the trace is saved after that step, in iteration_<step>. freq >= warmup + active.
ProfilerPhase profiler_phase(int64_t step, int64_t freq, int64_t warmup, int64_t active);

/// Which recorder writes a rank's trace. Kineto (libkineto; CPU ops and, on CUDA, kernels and copies)
/// is one session per process: with ranks as threads of one process, the first rank to start a
/// capture holds it and the others record their own thread's ops with titan's recorder (a thread-local
/// at::RecordFunction observer, the same names and Chrome-trace fields, CPU only).
enum class ProfilerBackend { automatic, kineto, thread_local_recorder };

/// A rank's profiler on torchtitan's schedule.
class Profiler {
 public:
  struct Options {
    std::filesystem::path folder{};  ///< <dump_folder>/<save_traces_folder>
    int64_t rank = 0;                ///< names the files (rank<r>_trace.json)
    int64_t freq = 10;               ///< profiling.profile_freq
    int64_t warmup = 3;              ///< profiling.profiler_warmup
    int64_t active = 1;              ///< profiling.profiler_active
    bool cuda = false;               ///< also record CUDA activity (Kineto only)
    ProfilerBackend backend =
        ProfilerBackend::automatic;  ///< automatic: Kineto unless another rank of this process holds it
  };
  explicit Profiler(Options options);
  /// Stops a capture still running without saving it (finish() saves it).
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  /// Call on the rank's thread before step `step` runs: warms up or starts recording per the schedule.
  void begin_step(int64_t step);
  /// Call after step `step`: when it ends a cycle, stops recording and writes the trace; returns its path.
  std::optional<std::filesystem::path> end_step(int64_t step);
  /// The run ended at `last_step` inside a cycle: saves what was recorded (as torch.profiler does on exit).
  std::optional<std::filesystem::path> finish(int64_t last_step);
  /// The recorder of the last capture (automatic until one started).
  ProfilerBackend backend() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// A rank's memory snapshots (profiling.enable_memory_snapshot): from construction on, CUDA records
/// the caching allocator's history (100000 entries, as torchtitan), CPU the tracker's timeline.
class MemorySnapshotter {
 public:
  struct Options {
    std::filesystem::path folder{};    ///< <dump_folder>/<save_memory_snapshot_folder>
    int64_t rank = 0;                  ///< names the files (rank<r>_memory_snapshot.*)
    int64_t freq = 10;                 ///< profiling.profile_freq: a snapshot after every multiple
    c10::Device device = c10::kCPU;    ///< CUDA: the allocator's snapshot; CPU: `tracker`'s timeline
    MemoryTracker* tracker = nullptr;  ///< this rank's tracker (CPU; required there)
  };
  explicit MemorySnapshotter(Options options);
  /// Stops recording.
  ~MemorySnapshotter();
  MemorySnapshotter(const MemorySnapshotter&) = delete;
  MemorySnapshotter& operator=(const MemorySnapshotter&) = delete;

  /// Marks step `step`'s start in the CPU timeline.
  void begin_step(int64_t step);
  /// After step `step`: writes iteration_<step>/... when step % freq == 0; returns the file.
  std::optional<std::filesystem::path> end_step(int64_t step);
  /// Step `step` failed (out of memory): writes iteration_<step - 1>_exit/... (torchtitan's name).
  std::filesystem::path write_on_failure(int64_t step);
  /// Writes a snapshot to `dir`/rank<r>_memory_snapshot.{pickle,json} now; returns the file.
  std::filesystem::path write(const std::filesystem::path& dir, int64_t step);

 private:
  Options options_;
};

/// titan's CPU memory timeline as JSON (format "titan.memory_timeline", version 1; see
/// docs/observability.md): the events as [time_us, bytes, category, total_bytes] rows.
std::string memory_timeline_json(const MemoryTimeline& timeline, int64_t rank, int64_t step);

/// Whether `e` is an allocator's out-of-memory error: c10::OutOfMemoryError (CUDA), or the CPU
/// allocator's "not enough memory".
bool is_out_of_memory(const std::exception& e);

}  // namespace titan
