// SPDX-License-Identifier: BSD-3-Clause
// Starting one rank: its environment (torchrun's contract) and the fork/exec with its output on pipes.
#pragma once

#include "options.hpp"

#include <sys/types.h>
#include <csignal>
#include <string>
#include <vector>

namespace titan_run {

/// A started rank. It leads its own process group (pgid == pid), so signalling -pid reaches it and
/// everything it started.
struct RankProcess {
  int rank = 0;     ///< global rank
  pid_t pid = -1;   ///< process id and process group id
  int out_fd = -1;  ///< read end of its stdout (non-blocking)
  int err_fd = -1;  ///< read end of its stderr (non-blocking)
};

/// Which start of the job this is: 0 for the first, k after k restarts, and why the last one ended.
struct Attempt {
  int restart_count = 0;  ///< restarts so far
  std::string reason{};  ///< the previous attempt's failure ("rank 1 was killed by signal 9 (SIGKILL)"); empty at first
};

/// The launcher's environment plus torchrun's variables for `local_rank`, and the restart variables
/// (TITAN_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TITAN_RESTART_REASON), and
/// TITAN_RUN_HANG_FILE: where a rank that sees another hang names it (empty: nowhere).
std::vector<std::string> rank_environment(const Options& options, int local_rank, int master_port,
                                          const Attempt& attempt = {}, const std::string& hang_file = {});

/// A TCP port that is free now (bind to port 0, read it back). Another process could take it before
/// rank 0 binds it; torchrun's standalone mode accepts the same race.
int pick_free_port();

/// Forks and execs `command` as rank `rank`: stdin /dev/null, stdout/stderr to pipes, its own process
/// group, killed if the launcher dies (PR_SET_PDEATHSIG), `child_mask` as its signal mask.
/// Throws std::runtime_error when the pipes or the fork fail; a failed exec makes the rank exit 127.
RankProcess spawn_rank(const std::vector<std::string>& command, const std::vector<std::string>& env, int rank,
                       const sigset_t& child_mask);

}  // namespace titan_run
