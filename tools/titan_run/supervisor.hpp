// SPDX-License-Identifier: BSD-3-Clause
// Runs the ranks to completion: relays their output line by line, forwards SIGINT/SIGTERM/SIGHUP, and
// stops every rank when one fails; with --max-restarts, starts the job again.
#pragma once

#include "options.hpp"

namespace titan_run {

/// Starts options.nproc_per_node ranks and waits for all of them, starting them all again after a failure
/// up to options.max_restarts times. Returns titan-run's exit status: 0 when every rank exited 0 (also
/// after a forwarded signal); else the last failed rank's exit status (128 + signal when it was killed),
/// or 128 + the signal that interrupted the launcher.
int supervise(const Options& options);

}  // namespace titan_run
