// SPDX-License-Identifier: BSD-3-Clause
// Private: the process's progress as the flight recorder (src/dist/flight_recorder.cpp) publishes and
// updates it. The training thread writes it; the watchdog thread reads it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "titan/dist/heartbeat.hpp"

namespace titan::dist::detail {

/// The process's progress at one moment.
struct Progress {
  int64_t step = 0;
  std::string phase{};
  bool timed = true;
  int64_t count = 0;        // progress events so far
  int64_t wall_us = 0;      // wall clock of the last one
  int64_t waiting_id = -1;  // the flight-recorder entry the training thread waits on; -1: none
};

Progress progress();
/// One progress event: the training thread reached a collective (waiting_id -1), waits on entry
/// waiting_id, or saw a collective complete (-1).
void note_progress(int64_t waiting_id);
/// The watchdog saw collective `id` complete: the training thread no longer waits on it (a progress
/// event). Not for a failed one: the training thread stays inside it until its wait() throws.
void collective_done(int64_t id);
/// True once, after hang_in_next_collective_for_test.
bool take_test_hang();
/// The hang find_hung_ranks reports, in a few words for the launcher: "rank 1 hung (no progress for 5 s at
/// step 4, data loading; detected by rank 0)", one such part per hung rank; empty when none.
std::string hang_summary(const std::vector<Heartbeat>& beats, int64_t now_us, std::chrono::milliseconds stale,
                         int64_t detected_by);
/// The silent ranks find_silent_ranks reports, in a few words for the launcher: "ranks 2, 3 on node1
/// (10.0.0.2) unreachable (no heartbeat for 6 s; detected by rank 0)", one part per host; empty when none.
std::string silent_summary(const std::vector<Heartbeat>& beats, int64_t now_us, std::chrono::milliseconds silent,
                           int64_t detected_by);
/// Under titan-run, writes `summary` to $TITAN_RUN_HANG_FILE, from which the launcher names the hung rank in
/// its log and in the restart reason (restarts.jsonl); nothing when the variable is unset (torchrun).
void tell_launcher_of_hang(const std::string& summary);
/// The store key of a rank's heartbeat.
std::string heartbeat_key(int64_t rank);
/// This machine's host name ("localhost" when unknown).
std::string host_name();

}  // namespace titan::dist::detail
