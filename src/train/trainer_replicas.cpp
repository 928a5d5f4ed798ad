// SPDX-License-Identifier: BSD-3-Clause
// The trainer's side of replica fault tolerance ([fault_tolerance]; dist/replica_group.hpp has the
// protocol): each step starts with the quorum, a replica behind it receives the training state a
// checkpoint would hold from a live one, and the step's gradients are averaged over the live replicas
// before clipping; a step that does not commit is run again with the same batch.
#include <ATen/ATen.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <string>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/dist/replica_group.hpp"
#include "titan/train/detail/trainer_core.hpp"

namespace titan::detail {

void TrainerCore::start_replicas() {
  const FaultToleranceConfig& ft = config_.fault_tolerance;
  if (!ft.enable) return;
  if (!expert_biases_.empty()) {
    throw ConfigError("fault_tolerance.enable",
                      fmt::format("[titan::Trainer] expected no MoE expert bias under fault tolerance, got {} layers "
                                  "with one: their expert loads are summed inside one replica group only. Turn "
                                  "fault_tolerance.enable off for this model.",
                                  expert_biases_.size()));
  }
  std::string lighthouse = ft.lighthouse;
  if (lighthouse.empty()) {
    const char* env = std::getenv("TITAN_FT_LIGHTHOUSE");
    lighthouse = env == nullptr ? "" : env;
  }
  if (lighthouse.empty()) {
    throw ConfigError("fault_tolerance.lighthouse",
                      "[titan::Trainer] expected the lighthouse address (host:port) with fault_tolerance.enable, got "
                      "none. Start titan-lighthouse and set fault_tolerance.lighthouse or TITAN_FT_LIGHTHOUSE.");
  }
  replicas_ = std::make_unique<dist::ReplicaGroup>(
      dist::ReplicaOptions{.replica_id = ft.replica_id,
                           .group_size = ft.group_size,
                           .min_replica_size = ft.min_replica_size,
                           .lighthouse = lighthouse,
                           .join_timeout = std::chrono::milliseconds(ft.join_timeout_ms),
                           .timeout = std::chrono::milliseconds(ft.process_group_timeout_ms),
                           // The group's other ranks wait for rank 0's quorum in a collective.
                           .quorum_timeout = std::chrono::seconds(config_.comm.train_timeout_seconds) * 9 / 10,
                           .backend = ft.process_group,
                           .wait_for = faults_.ft_wait},
      mesh_->group("world"));
  log::info("Fault tolerance: replica group {} of {} (at least {} live), lighthouse {}", ft.replica_id, ft.group_size,
            ft.min_replica_size, lighthouse);
}

void TrainerCore::join_replicas() {
  const dist::Quorum& q = replicas_->quorum(step_);
  if (!q.behind() && !q.sends()) return;
  const int64_t source = q.replicas.at(static_cast<size_t>(q.source));
  if (q.behind()) {
    log::info(
        "Replica group {} is at step {}, the quorum at step {}: receiving the training state from replica group {}",
        config_.fault_tolerance.replica_id, step_, q.max_step(), source);
  }
  // Everything a checkpoint holds, sent tensor by tensor in the same order on both sides.
  const auto start = std::chrono::steady_clock::now();
  checkpoint::State state = checkpoint_state();
  std::vector<at::Tensor> tensors;
  tensors.reserve(state.tensors.size());
  for (const auto& st : state.tensors) tensors.push_back(st.tensor);
  std::string values = state.values.dump();
  if (!replicas_->heal(tensors, values) || !q.behind()) return;  // a failed heal fails the step's commit
  apply_state(state, nlohmann::json::parse(values));
  log::info("Replica group {} healed to step {} in {:.2f} s ({} tensors)", config_.fault_tolerance.replica_id, step_,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), tensors.size());
}

bool TrainerCore::commit_over_replicas() {
  std::vector<at::Tensor> grads;
  for (const auto& p : model_.parameters) grads.push_back(p.grad());
  replicas_->average(grads);
  return replicas_->commit();
}

}  // namespace titan::detail
