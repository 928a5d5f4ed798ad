// SPDX-License-Identifier: BSD-3-Clause
// Preemption and restarts, the trainer's side: the signals that make every rank save a checkpoint at the
// end of the current step and stop (checkpoint.preemption_signals), the restart record a relaunched job
// appends to its run folder, and the test hook that kills a rank at a step. See docs/fault_tolerance.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "titan/core/test_faults.hpp"

namespace titan::detail {

/// While alive, the named signals ("SIGTERM", "SIGUSR1", ...) only set a flag: the first one received
/// is remembered and every armed signal goes back to its default action, so a second signal stops the
/// process at once. Process-wide (signal dispositions are); nested instances share the one flag and the
/// last one to go restores the previous actions. An unknown name is an error naming it.
class PreemptionSignals {
 public:
  explicit PreemptionSignals(const std::vector<std::string>& names);
  ~PreemptionSignals();
  PreemptionSignals(const PreemptionSignals&) = delete;
  PreemptionSignals& operator=(const PreemptionSignals&) = delete;

  /// The first armed signal this process received, 0 when none.
  static int received();
  /// Forgets a received signal and arms the signals again (tests that run several trainers in one process).
  static void reset();
};

/// "SIGTERM" for 15.
std::string signal_name(int sig);

/// The launcher's restart count (TITAN_RESTART_COUNT, else torchrun's TORCHELASTIC_RESTART_COUNT; 0 when unset).
int64_t restart_count();

/// After a restart (restart_count() > 0): appends one JSON line to `dump_folder`/restarts.jsonl with the
/// count, the launcher's reason (TITAN_RESTART_REASON), the step training resumes at and the restarted
/// job's world size (an elastic restart may have fewer or more ranks). Call on one rank.
void record_restart(const std::filesystem::path& dump_folder, int64_t resume_step, int64_t world_size);

/// The step faults of testing::Faults, as `rank` is about to run `step`: kill SIGKILLs this process, hang makes
/// its next collective sleep instead of issuing (dist::hang_in_next_collective_for_test). The trainer passes
/// them only on the first attempt (restart_count() == 0), so a restarted run gets past the step.
void inject_step_faults(const testing::Faults& faults, int64_t rank, int64_t step);

}  // namespace titan::detail
