// SPDX-License-Identifier: BSD-3-Clause
// Elastic rendezvous (--nnodes MIN:MAX): the titan-run agents of a job, one per node, meet at
// --master-addr:--master-port. The agent that can bind that address hosts the rendezvous (a small
// line protocol over TCP) and is node 0; the others connect to it. Each round the host assigns node
// ranks to the nodes ready, WORLD_SIZE = nodes x --nproc-per-node, and a fresh port for the ranks'
// own store; when a node fails or its agent is lost, every node stops its ranks and the nodes left
// (if at least MIN) start again as a new round, counted against --max-restarts. A node joining a
// running job below MAX makes the job start again with it (not counted). Every connection carries TCP
// keep-alive probes (--rdzv-conf keep_alive_interval, keep_alive_max_attempt), so a node cut off from the
// host is lost on both ends: the host goes on without it, its agent stops its ranks and exits. See
// docs/fault_tolerance.md and docs/launch.md.
#pragma once

#include "options.hpp"

#include <poll.h>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace titan_run {

/// One round as this node runs it.
struct Round {
  int node_rank = 0;      ///< this node's index in the round
  int nnodes = 1;         ///< nodes in the round
  int master_port = 0;    ///< the ranks' store port (on the host's --master-addr)
  int restart_count = 0;  ///< starts of the job before this one (failures and membership changes)
  std::string reason{};   ///< why the previous round ended; empty in the first
};

/// What the rendezvous asks of this node.
struct RendezvousEvent {
  enum class Kind { start, stop, exit };
  Kind kind = Kind::start;
  Round round{};          ///< start: the round to run
  bool graceful = false;  ///< stop: a membership change (--grace-seconds, the ranks may save), else a failure
  int status = 0;         ///< exit: titan-run's exit status
  std::string reason{};   ///< stop/exit: why
};

/// This agent's end of the rendezvous (the host's also serves the others). Single-threaded: the
/// supervisor polls fds() with its own descriptors and calls on_poll().
class Rendezvous {
 public:
  /// Hosts the rendezvous when --master-addr:--master-port can be bound here, else connects to it
  /// (retrying until join_timeout).
  explicit Rendezvous(const Options& options);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  bool is_host() const;

  /// This node is ready for the next round (its ranks have exited).
  void ready();
  /// This node's ranks all exited 0.
  void done();
  /// One of this node's ranks failed; `status` is what titan-run would exit with.
  void failed(int status, const std::string& reason);

  /// Descriptors to poll, and the longest wait before on_poll must run (-1: none).
  std::vector<pollfd> fds() const;
  int timeout_ms() const;
  /// Handles what `polled` (fds() after poll) reports, and any deadline that passed.
  void on_poll(const std::vector<pollfd>& polled);
  /// The next thing this node must do, if any.
  std::optional<RendezvousEvent> next_event();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan_run
