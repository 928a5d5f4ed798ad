// SPDX-License-Identifier: BSD-3-Clause
// The heartbeat: the training thread reports its progress (step, phase) and every collective it reaches,
// waits on and sees complete counts as progress too; the flight recorder's watchdog thread publishes
// it to the launch store about once a second, and rank 0's watchdog reads every rank's. A rank whose
// last progress is older than comm.train_timeout_seconds while it is not waiting in a collective is
// the hung one: every rank stops with a message naming it, and the flight recorder dumps as for a
// timed-out collective. A rank whose heartbeat stops reaching the store for as long (its host cut off, or
// its process gone) is named with its host the same way. See docs/fault_tolerance.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace titan::dist {

/// Reports that this process's training thread is at `step` (1-based; 0 before training), starting
/// `phase` ("forward/backward", ...). `timed` false: the heartbeat does not time this phase (a
/// checkpoint save, which the checkpoint commit times, or the end of training). Cheap: one lock.
void report_progress(int64_t step, std::string_view phase, bool timed = true);

/// Test hook behind the test fault hang (core/test_faults.hpp): the next collective this process issues (while the
/// flight recorder is on) does not issue; the thread sleeps there, ignoring every stop request, for ten collective
/// timeouts and then throws, as a rank stuck inside a collective would.
void hang_in_next_collective_for_test();

/// One rank's heartbeat as published to the store.
struct Heartbeat {
  int64_t rank = 0;
  int64_t step = 0;       ///< the step the training thread is on (0: not training yet, never timed)
  std::string phase{};    ///< what it was doing at its last progress
  int64_t progress = 0;   ///< progress events so far
  int64_t wall_us = 0;    ///< wall clock of the last progress, microseconds since the epoch
  std::string waiting{};  ///< the collective the training thread waits in; empty when none
  bool timed = true;      ///< false in phases the heartbeat does not time
  int64_t pid = 0;        ///< the rank's process id
  std::string host{};     ///< the rank's host name
  std::string addr{};     ///< the address its host reaches the store from (its Gloo address); empty: unknown
  int64_t beat_us = 0;    ///< wall clock when it was published (about once a second); 0: unknown
  bool stopped = false;   ///< its last: the rank stopped publishing (its run stopped or ended)
};

std::string encode_heartbeat(const Heartbeat& beat);
Heartbeat decode_heartbeat(const std::string& text);

/// The hang the heartbeats show at `now_us`, in words, or nullopt: the ranks that are training (step
/// >= 1), in a timed phase and not waiting in a collective, and made no progress for at least `stale`.
/// The sentence names each with its last step and phase, the ranks waiting for it, the timeout, and
/// what to do. Wall clocks of different hosts are compared: they must agree to a second or so (NTP).
std::optional<std::string> find_hung_ranks(const std::vector<Heartbeat>& beats, int64_t now_us,
                                           std::chrono::milliseconds stale, std::chrono::milliseconds timeout);

/// The ranks whose heartbeat stopped reaching the store, in words, or nullopt: those that published one
/// (beat_us set) that is not their last, at least `silent` before `now_us`. Grouped by host, the sentence
/// names each host's ranks, its address, how long they have been silent and where they were, that the host
/// is cut off from `store` ("the store at HOST:PORT") or its processes are gone, the timeout and what to do.
std::optional<std::string> find_silent_ranks(const std::vector<Heartbeat>& beats, int64_t now_us,
                                             std::chrono::milliseconds silent, std::chrono::milliseconds timeout,
                                             const std::string& store);

}  // namespace titan::dist
