// SPDX-License-Identifier: BSD-3-Clause
// titan-run's command line.
#pragma once

#include <string>
#include <vector>

namespace titan_run {

/// What to launch and how.
struct Options {
  int nproc_per_node = 1;                   ///< ranks started on this node
  int nnodes = 1;                           ///< nodes in the job (each runs its own titan-run); elastic: MAX
  int node_rank = 0;                        ///< this node's index in [0, nnodes); elastic: set by each round
  bool elastic = false;                     ///< --nnodes MIN:MAX: the agents meet in an elastic rendezvous
  int min_nodes = 1;                        ///< elastic: fewest nodes a round starts with
  int max_nodes = 1;                        ///< elastic: most nodes in a round
  double join_timeout_seconds = 600.0;      ///< elastic: wait this long for MIN nodes (torchrun's join_timeout)
  double last_call_timeout_seconds = 30.0;  ///< elastic: once MIN are ready, wait this long for more
  int keep_alive_interval_seconds = 5;      ///< elastic: probe a quiet rendezvous link this often (torchrun's name)
  int keep_alive_max_attempt = 3;           ///< elastic: unanswered probes before the other end counts as lost
  std::string master_addr = "127.0.0.1";    ///< rank 0's host, for the rendezvous store
  bool master_addr_given = false;           ///< --master-addr or --rdzv-endpoint was passed
  int master_port = 0;                      ///< rendezvous port; 0 picks a free one (single node only)
  double grace_seconds = 30.0;              ///< SIGTERM-to-SIGKILL delay when stopping ranks (a checkpoint fits)
  double failure_grace_seconds = 3.0;       ///< the same delay after a rank failed (at most grace_seconds)
  int max_restarts = 0;                     ///< times the whole job is started again after a rank fails
  bool help = false;                        ///< print the usage and exit
  std::vector<std::string> command;         ///< the program and its arguments
};

/// The global rank of this node's `local_rank`-th rank.
inline int global_rank(const Options& options, int local_rank) {
  return options.node_rank * options.nproc_per_node + local_rank;
}

/// Parses argv; throws std::invalid_argument with a message that names the flag.
Options parse_options(int argc, char** argv);

/// The warnings a valid command line still deserves, one line each (without "titan-run: "): a job of
/// several nodes whose rendezvous address is loopback (127.0.0.0/8, ::1, localhost), which no other host
/// reaches.
std::vector<std::string> warnings(const Options& options);

/// The --help text.
std::string usage();

}  // namespace titan_run
