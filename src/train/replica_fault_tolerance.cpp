// SPDX-License-Identifier: BSD-3-Clause
// The trainer's side of replica fault tolerance ([fault_tolerance]; dist/replica_group.hpp has the protocol): each
// step starts with the quorum, a replica behind it receives the training state a checkpoint would hold from a live
// one, and the step's gradients are averaged over the live replicas before clipping; a step that does not commit is
// run again with the same batch.
#include "titan/train/replica_fault_tolerance.hpp"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <string>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/test_faults.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/dist/replica_group.hpp"
#include "titan/train/run_context.hpp"
#include "titan/train/semi_sync.hpp"
#include "titan/train/training_state.hpp"

namespace titan {
namespace {

std::string lighthouse_address(const FaultToleranceConfig& ft) {
  if (!ft.lighthouse.empty()) return ft.lighthouse;
  const char* env = std::getenv("TITAN_FT_LIGHTHOUSE");
  const std::string address = env == nullptr ? "" : env;
  if (address.empty()) {
    throw ConfigError("fault_tolerance.lighthouse",
                      "[titan::ReplicaFaultTolerance] expected the lighthouse address with fault_tolerance.enable, "
                      "got none. Start titan-lighthouse and set fault_tolerance.lighthouse or TITAN_FT_LIGHTHOUSE to "
                      "its host:port, or to http://host:port of TorchFT's torchft_lighthouse.");
  }
  return address;
}

}  // namespace

void heal_state(dist::ReplicaGroup& replicas, TrainingState& state, int64_t replica_id) {
  const dist::Quorum& q = replicas.current();
  if (!q.behind() && !q.sends()) return;
  const int64_t source = q.replicas.at(static_cast<size_t>(q.source));
  if (q.behind()) {
    log::info(
        "Replica group {} is at step {}, the quorum at step {}: receiving the training state from replica group {}",
        replica_id, state.step, q.max_step(), source);
  }
  // Everything a checkpoint holds, sent tensor by tensor in the same order on both sides.
  const auto start = std::chrono::steady_clock::now();
  checkpoint::State held = state.state();
  std::vector<at::Tensor> tensors;
  tensors.reserve(held.tensors.size());
  for (const auto& st : held.tensors) tensors.push_back(st.tensor);
  std::string values = held.values.dump();
  if (!replicas.heal(tensors, values) || !q.behind()) return;  // a failed heal fails the step's commit
  state.apply(held, nlohmann::json::parse(values));
  log::info("Replica group {} healed to step {} in {:.2f} s ({} tensors)", replica_id, state.step,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), tensors.size());
}

ReplicaFaultTolerance::ReplicaFaultTolerance(const RunContext& run, const TrainingState& state) : run_(run) {
  const FaultToleranceConfig& ft = run.config().fault_tolerance;
  const auto& biases = state.parts().expert_biases;
  if (!biases.empty()) {
    throw ConfigError("fault_tolerance.enable",
                      fmt::format("[titan::ReplicaFaultTolerance] expected no MoE expert bias under fault tolerance, "
                                  "got {} layers with one: their expert loads are summed inside one replica group "
                                  "only. Turn fault_tolerance.enable off for this model.",
                                  biases.size()));
  }
  const std::string lighthouse = lighthouse_address(ft);
  replicas_ = std::make_unique<dist::ReplicaGroup>(
      dist::ReplicaOptions{.replica_id = ft.replica_id,
                           .group_size = ft.group_size,
                           .min_replica_size = ft.min_replica_size,
                           .lighthouse = lighthouse,
                           .join_timeout = std::chrono::milliseconds(ft.join_timeout_ms),
                           .timeout = std::chrono::milliseconds(ft.process_group_timeout_ms),
                           // The group's other ranks wait for rank 0's quorum in a collective.
                           .quorum_timeout = std::chrono::seconds(run.config().comm.train_timeout_seconds) * 9 / 10,
                           .backend = ft.process_group,
                           .wait_for = testing::faults().ft_wait},
      run.mesh().group("world"));
  log::info("Fault tolerance: replica group {} of {} (at least {} live), lighthouse {}", ft.replica_id, ft.group_size,
            ft.min_replica_size, lighthouse);
}

ReplicaFaultTolerance::~ReplicaFaultTolerance() = default;

void ReplicaFaultTolerance::join(TrainingState& state) {
  replicas_->quorum(state.step);
  heal(state);
}

void ReplicaFaultTolerance::heal(TrainingState& state) {
  heal_state(*replicas_, state, run_.config().fault_tolerance.replica_id);
}

bool ReplicaFaultTolerance::commit(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters) grads.push_back(p.grad());
  replicas_->average(grads);
  return replicas_->commit();
}

void ReplicaFaultTolerance::outer_step(TrainingState& state, SemiSync& outer) {
  synchronize(*replicas_, outer, state.step, [&] { heal(state); });
}

int64_t ReplicaFaultTolerance::live() const { return replicas_->live(); }

}  // namespace titan
