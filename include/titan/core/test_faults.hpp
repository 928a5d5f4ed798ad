// SPDX-License-Identifier: BSD-3-Clause
// The one seam through which tests inject faults into a run (a rank killed or hung at a step, a
// skipped collective, a simulated out-of-memory, a slow checkpoint write, a replica quorum that waits).
// Every field's default is "no fault", so a normal run never pays for them beyond one read at setup.
//
// In-process tests set them with one call:
//   titan::testing::set_faults({.oom_step = 2});
// Process tests (build/bin/train under titan-run) set one variable, read once at the first faults():
//   TITAN_TEST_FAULTS="kill=1:3,hang=0:5,skip_collective=1:12,oom=2,ft_wait=1:2,ft_wait=12:2,
//                      checkpoint_write_delay_ms=500"
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string_view>

namespace titan::testing {

/// A world rank and the step (or collective number) at which a fault strikes it.
struct RankAt {
  int64_t rank = 0;  ///< world rank
  int64_t at = 0;    ///< 1-based step, or collective number for skip_collective
};

/// Faults a test injects. Readers copy them when a run is set up (trainer, checkpointer, flight recorder).
struct Faults {
  /// kill=R:S: world rank R SIGKILLs itself as step S starts (first attempt only: no launcher restart yet).
  std::optional<RankAt> kill{};
  /// hang=R:S: rank R's first collective of step S sleeps instead of issuing (first attempt only).
  std::optional<RankAt> hang{};
  /// skip_collective=R:N: rank R never issues its N-th collective (all groups) and waits for the watchdog.
  std::optional<RankAt> skip_collective{};
  /// oom=S: step S fails as out of memory after its forward/backward, its activations' scope still open.
  std::optional<int64_t> oom_step{};
  /// ft_wait=S:N (repeatable): the replica quorum that starts step S waits for N replica groups.
  std::map<int64_t, int64_t> ft_wait{};
  /// checkpoint_write_delay_ms=N: each rank pauses N ms before writing its part of a checkpoint.
  int64_t checkpoint_write_delay_ms = 0;
};

/// The faults in force in this process: the last set_faults, else TITAN_TEST_FAULTS parsed at the first
/// call (an error names the variable and the bad item), else none.
Faults faults();

/// Replaces the faults in force for this process (in-process tests); `Faults{}` clears them. Returns the
/// previous ones, for a test to restore.
Faults set_faults(const Faults& faults);

/// Parses TITAN_TEST_FAULTS' syntax: comma-separated `name=value` items as in the header comment.
Faults parse_faults(std::string_view text);

}  // namespace titan::testing
