// SPDX-License-Identifier: BSD-3-Clause
// Replica fault tolerance (TorchFT's idea over HSDP): every replica group is a job of its own (its
// own launcher, store and FSDP/TP world), and the groups meet each step in a quorum through a
// lighthouse: titan's own, one shared store (tools/titan-lighthouse, addressed host:port), or TorchFT's
// `torchft_lighthouse` (addressed http://host:port; the build's TITAN_WITH_GRPC). Rank r of every live replica joins a
// cross-replica group with the other replicas' rank r; gradients are averaged over it, and the step
// commits only when every member says its step went through. A replica that dies is left out of the
// next quorum (the others wait fault_tolerance.join_timeout_ms for it, then go on); one that
// (re)joins behind the others receives the current state from a live replica before the step runs.
//
// Per step, on every rank of a replica (collective over the replica's own world group):
//
//   Quorum q = replicas.quorum(committed_step);      // blocks until the quorum is decided
//   if (q.behind()) replicas.heal(state, values);    // from q's source replica, same shard rank
//   else if (q.source()) replicas.heal(state, values);  // the source sends to every joiner
//   ... forward, backward (FSDP inside the replica) ...
//   replicas.average(grads);                         // over the live replicas; failures are recorded
//   if (replicas.commit()) optimizer.step(lr); else  // agreed by all members: redo the step
//
// titan's lighthouse decides a round when a member first sees it ready: every replica of the previous
// quorum arrived (or all group_size), or join_timeout passed with at least min_replica_size; TorchFT's
// decides by its own flags (--min_replicas, --join_timeout_ms) and titan asks again while the quorum is
// below min_replica_size. A replica that arrives after the decision joins the next round.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace titan::dist {

class ProcessGroup;

/// How one replica group takes part in the fault-tolerant job ([fault_tolerance]).
struct ReplicaOptions {
  /// This replica group's id, 0 .. group_size - 1.
  int64_t replica_id = 0;
  /// Replica groups the job is planned with.
  int64_t group_size = 1;
  /// Fewest live replicas a step may run with.
  int64_t min_replica_size = 1;
  /// host:port of titan-lighthouse, or http://host:port of TorchFT's torchft_lighthouse.
  std::string lighthouse{};
  /// How long a round waits for the previous quorum's replicas (or, in the first round, for all); titan's
  /// lighthouse only (TorchFT's takes --join_timeout_ms).
  std::chrono::milliseconds join_timeout{60000};
  /// Cross-replica collectives, group creation and the commit vote.
  std::chrono::milliseconds timeout{10000};
  /// The longest a quorum may take (min_replica_size not reached): keep it below the replica's own collective
  /// timeout, since its other ranks wait for rank 0's quorum in a broadcast.
  std::chrono::milliseconds quorum_timeout{90000};
  /// gloo or nccl.
  std::string backend = "gloo";
  /// Test hook: step -> how many replicas the quorum that starts that step waits for (no join timeout).
  std::map<int64_t, int64_t> wait_for{};
};

/// One decided quorum, as every rank of every member replica sees it.
struct Quorum {
  int64_t round = 0;                ///< titan's lighthouse: the round that decided it; TorchFT's: 1, 2, ... per id
  int64_t id = 0;                   ///< changes whenever the members (or their group) change
  std::vector<int64_t> replicas{};  ///< member replica ids, ascending
  std::vector<int64_t> steps{};     ///< each member's committed step when it joined
  int64_t me = -1;                  ///< this replica's index in replicas
  int64_t source = -1;              ///< index of the replica that heals the others (lowest id at max step)
  int64_t max_step() const;
  /// This replica is behind the quorum's step and must receive the state first.
  bool behind() const { return steps.at(static_cast<size_t>(me)) < max_step(); }
  /// Some member is behind and this replica is the one that sends.
  bool sends() const;
};

/// This rank's side of the fault-tolerant job (one per rank; the replica's rank 0 talks to the lighthouse).
class ReplicaGroup {
 public:
  /// replica_world: this replica's own world group (its ranks agree on everything through it).
  ReplicaGroup(ReplicaOptions options, const ProcessGroup& replica_world);
  ~ReplicaGroup();
  ReplicaGroup(const ReplicaGroup&) = delete;
  ReplicaGroup& operator=(const ReplicaGroup&) = delete;

  /// Joins the next quorum with this replica's committed step; rebuilds the cross-replica group when
  /// the members changed or the last step failed. Throws when min_replica_size is not reached in time.
  const Quorum& quorum(int64_t committed_step);
  /// The last quorum.
  const Quorum& current() const;
  /// Sends (source) or receives (behind) `tensors` (same shapes and dtypes on every replica) and
  /// `values` (any bytes). Others return at once. A failure marks the step failed and returns false.
  bool heal(const std::vector<at::Tensor>& tensors, std::string& values);
  /// Averages each tensor over the live replicas in place (SUM / members). A failure (a member died)
  /// marks the step failed instead of throwing.
  void average(const std::vector<at::Tensor>& tensors);
  /// Whether every member's step went through (all its ranks and all members agree); the verdict is
  /// the same on every rank of every member. false: discard the step and run it again.
  bool commit();
  /// Members of the current quorum.
  int64_t live() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan::dist
