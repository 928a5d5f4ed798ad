// SPDX-License-Identifier: BSD-3-Clause
// ReplicaFaultTolerance: fault_tolerance.enable, TorchFT's idea: replica groups (each a whole mesh) that train the
// same model on different data and average their gradients every step; when one fails the others go on, and when
// it comes back it receives their training state and rejoins (dist/replica_group.hpp has the protocol, the
// lighthouse hands out the quorums). Each step starts with join() and commits after backward; under semi-sync
// (train/semi_sync.hpp) the groups meet only in outer_step(), every fault_tolerance.sync_steps steps.
//
//   titan::ReplicaFaultTolerance replicas(run, state);
//   replicas.join(state);                               // before the step
//   ... forward, backward ...
//   if (!replicas.commit(params)) { /* run the step again with the same batch */ }
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace titan {
class RunContext;
class SemiSync;
class TrainingState;
namespace dist {
class ReplicaGroup;
}

/// Sends the training state (what a checkpoint holds) to the members behind `replicas`' current quorum when this
/// group is the source, or receives it into `state` when this group is behind (replica_id: for the log). A failure
/// marks the step failed: the commit says so.
void heal_state(dist::ReplicaGroup& replicas, TrainingState& state, int64_t replica_id);

class ReplicaFaultTolerance {
 public:
  /// Connects this replica group (fault_tolerance.replica_id of group_size) to the lighthouse (fault_tolerance.
  /// lighthouse, else TITAN_FT_LIGHTHOUSE). Refuses a state with expert biases: their loads are summed inside one
  /// replica group only.
  ReplicaFaultTolerance(const RunContext& run, const TrainingState& state);
  ~ReplicaFaultTolerance();
  ReplicaFaultTolerance(const ReplicaFaultTolerance&) = delete;
  ReplicaFaultTolerance& operator=(const ReplicaFaultTolerance&) = delete;

  /// The quorum of the coming step (state.step + 1); a replica group behind the others receives their training
  /// state into `state`, one that is ahead sends its own.
  void join(TrainingState& state);
  /// The gradients of `parameters` averaged over the live replica groups; false when the step did not commit (a
  /// group failed) and must run again with the same batch.
  bool commit(const std::vector<at::Tensor>& parameters);
  /// Semi-synchronous training's outer step after inner step state.step: the quorum (a group behind it receives the
  /// training state, the outer state included, and counts for nothing in this step), the average of `outer`'s
  /// contributions over the live groups, the commit, then outer.apply(). A try that does not commit runs again with
  /// the groups left; the inner steps are never repeated.
  void outer_step(TrainingState& state, SemiSync& outer);
  /// Replica groups in the last quorum.
  int64_t live() const;

 private:
  const RunContext& run_;
  // Sends the training state to the members behind the current quorum, or receives it when this group is.
  void heal(TrainingState& state);

  std::unique_ptr<dist::ReplicaGroup> replicas_;
};

}  // namespace titan
