// SPDX-License-Identifier: BSD-3-Clause
// The flight recorder: every collective a ProcessGroup issues goes into a per-rank ring buffer
// (comm.trace_buf_size entries) with its group, per-group sequence number, op, shape, dtype, state and
// timestamps. A watchdog stops the run when a collective does not complete within the collective
// timeout: every rank dumps its buffer to comm.save_traces_folder, and find_first_mismatch (the
// titan-trace tool) names the rank and the collective where the ranks parted. See docs/observability.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace titan::dist {

/// Where a recorded collective is: issued to the backend, a host thread waiting on it, done or failed.
enum class TraceState { kScheduled, kStarted, kCompleted, kFailed };

std::string_view to_string(TraceState state);

/// One collective as one rank saw it.
struct TraceEntry {
  int64_t id = 0;                ///< issue order on this rank, all groups (0-based)
  int64_t seq = 0;               ///< per-group sequence number (1-based): equal on every member
  std::string group{};           ///< group name ("world", "dp_shard", ...)
  std::vector<int64_t> ranks{};  ///< the group's world ranks
  std::string op{};              ///< all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send, recv, barrier
  std::vector<int64_t> sizes{};  ///< input tensor shape (empty for barrier)
  std::string dtype{};           ///< input dtype ("Float", ...)
  TraceState state = TraceState::kScheduled;
  int64_t scheduled_us = 0;  ///< wall clock, microseconds since the epoch
  int64_t started_us = 0;    ///< 0 until a thread waits on it
  int64_t completed_us = 0;  ///< 0 until it completed or failed
};

/// A fixed-size ring of TraceEntry: recording is one lock and one slot write; the oldest entry is
/// overwritten when full. Thread-safe.
class FlightRecorder {
 public:
  explicit FlightRecorder(int64_t capacity);

  int64_t capacity() const { return static_cast<int64_t>(ring_.size()); }
  /// Records a scheduled collective; sets entry.id and returns it.
  int64_t record(TraceEntry entry);
  /// Moves entry id to state (timestamped now); a no-op when the ring has overwritten it.
  void update(int64_t id, TraceState state);
  /// The entry with this id, if still in the ring.
  std::optional<TraceEntry> find(int64_t id) const;
  /// Every entry still in the ring, oldest first.
  std::vector<TraceEntry> entries() const;

 private:
  mutable std::mutex mutex_;
  std::vector<TraceEntry> ring_;
  int64_t next_id_ = 0;
};

/// One rank's dump: its world rank, why the dump was taken, and its ring.
struct RankTrace {
  int64_t rank = 0;
  int64_t world_size = 1;
  std::string reason{};
  std::vector<TraceEntry> entries{};
};

/// Writes a dump as JSON (temp file + rename, so a reader never sees half a file).
void write_trace(const RankTrace& trace, const std::filesystem::path& file);
RankTrace read_trace(const std::filesystem::path& file);
/// Every *.json dump in folder, by rank.
std::vector<RankTrace> read_traces(const std::filesystem::path& folder);

/// The first place where the ranks' traces disagree, in words ("group 'world' (ranks 0,1) seq 3: rank 0
/// is in all_reduce [4] Float (scheduled, not completed) while rank 1 never issued it ..."), or
/// nullopt when every group's members issued the same collectives and all completed. A rank without a
/// dump is ignored. Among groups, the disagreement that started earliest (wall clock) is first.
std::optional<std::string> find_first_mismatch(const std::vector<RankTrace>& traces);

/// The process's recorder (one rank per process: the launcher contract).
struct FlightRecorderOptions {
  /// Ring entries (comm.trace_buf_size); 0 records nothing and starts no watchdog.
  int64_t buffer_size = 0;
  /// A collective not completed after this long stops the run (comm.train_timeout_seconds).
  std::chrono::milliseconds timeout{std::chrono::seconds(100)};
  /// Dump folder (job.dump_folder / comm.save_traces_folder); each rank writes <file_prefix><rank>.json.
  std::filesystem::path folder{"comm_traces"};
  std::string file_prefix = "rank_";
};

/// Turns the process's recorder on (or off with buffer_size 0) for the groups created afterwards'
/// collectives. The launch-environment Mesh connects it to the other ranks through its store, so that
/// the rank whose watchdog fires makes every rank dump.
///
/// The test fault skip_collective=<rank>:<n> (core/test_faults.hpp) makes world rank <rank> skip its n-th collective
/// (1-based, all groups): it never issues it, and waits there, as a rank stuck elsewhere would, until
/// the watchdog stops the run.
void enable_flight_recorder(const FlightRecorderOptions& options);

/// Stops this rank's watchdog reading the store (heartbeats, stop requests) and returns once it is not
/// reading it. A run's end calls it on every rank before a last barrier: rank 0 serves the store, and a
/// rank still polling when rank 0 exits gets a failed read (and c10d's warning with a stack trace).
void detach_flight_recorder_store();

}  // namespace titan::dist
