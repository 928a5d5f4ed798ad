// SPDX-License-Identifier: BSD-3-Clause
// SemiSync: the outer step of semi-synchronous training across replica groups (fault_tolerance.semi_sync_method,
// TorchFT's LocalSGD and DiLoCo as torchtitan configures them). Each replica group trains `sync_steps` inner steps
// on its own data with no cross-group traffic, then the groups meet once:
//
//   LocalSGD: the parameters become their average over the groups.
//   DiLoCo:   g = average over the groups of (last_sync - parameters), the pseudo-gradient;
//             buf = momentum * buf + g;  d = nesterov ? g + momentum * buf : buf   (torch.optim.SGD)
//             last_sync -= outer_lr * d;  parameters = lerp(last_sync, parameters, fragment_update_alpha)
//
// This class holds the math and the state (last_sync and buf, checkpointed and healed like the optimizer's); the
// cross-group average is the caller's (ReplicaFaultTolerance::outer_step). A group's contribution carries a weight
// (1, or 0 for a group that was just healed: it holds a copy of another group's parameters, which must count once),
// and the average is sum(weight * x) / sum(weight).
//
//   titan::SemiSync outer(options, parameters);
//   std::vector<at::Tensor> x = outer.contribution(/*counts=*/true);  // ... averaged over the groups in place ...
//   outer.apply(x);
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace titan {
struct FaultToleranceConfig;
namespace checkpoint {
struct State;
}
namespace dist {
class Mesh;
class ReplicaGroup;
}  // namespace dist

enum class SemiSyncMethod { local_sgd, diloco };

/// The outer step's settings (the fault_tolerance keys of the same names).
struct SemiSyncOptions {
  /// local_sgd or diloco.
  SemiSyncMethod method = SemiSyncMethod::diloco;
  /// Inner steps between two outer steps.
  int64_t sync_steps = 5;
  /// DiLoCo: the outer SGD's learning rate.
  double outer_lr = 0.7;
  /// DiLoCo: the outer SGD's momentum.
  double outer_momentum = 0.9;
  /// DiLoCo: Nesterov momentum.
  bool outer_nesterov = true;
  /// DiLoCo: weight of the local parameters in the new ones (0: the global parameters).
  double fragment_update_alpha = 0.0;
};

/// The options fault_tolerance.* asks for (semi_sync_method must be set).
SemiSyncOptions semi_sync_options(const FaultToleranceConfig& ft);

class SemiSync {
 public:
  /// `parameters`: the trained tensors (this rank's shards), updated in place by apply().
  SemiSync(SemiSyncOptions options, std::vector<at::Tensor> parameters);

  const SemiSyncOptions& options() const { return options_; }
  /// Whether the outer step follows inner step `step` (every sync_steps steps).
  bool due(int64_t step) const { return step % options_.sync_steps == 0; }

  /// Takes the current parameters as the last synchronised ones (a run that starts, or that loaded a checkpoint
  /// without this state) unless restored() says a checkpoint or a healing filled them.
  void start();
  /// The last_sync and momentum buffers were loaded (TrainingState::apply marks it).
  void restored() { restored_ = true; }

  /// What this group adds to the cross-group average: per parameter, weight * (last_sync - parameter) under DiLoCo or
  /// weight * parameter under LocalSGD, then the weight itself as a (1,) tensor; weight = counts ? 1 : 0. New tensors.
  std::vector<at::Tensor> contribution(bool counts) const;
  /// The outer step from the contributions' average over the groups (each entry divided by the group count, the
  /// weight too): parameters, last_sync and momentum change in place.
  void apply(const std::vector<at::Tensor>& averaged);

  /// Adds "semi_sync.<fqn>.last_sync" and "semi_sync.<fqn>.momentum_buffer" (DiLoCo; sharded like the parameter)
  /// and values["semi_sync"] ({method, sync_steps}).
  void add_state(checkpoint::State& state, const std::vector<std::string>& names, const dist::Mesh* mesh) const;

 private:
  SemiSyncOptions options_;
  std::vector<at::Tensor> parameters_;
  std::vector<at::Tensor> last_sync_;  // like parameters_: the global parameters of the last outer step (DiLoCo)
  std::vector<at::Tensor> momentum_;   // like parameters_: the outer SGD's momentum buffer (DiLoCo)
  bool restored_ = false;
};

/// One outer step across the replica groups after inner step `step`: the quorum; `heal()` (sends or receives the
/// training state when a member is behind: ReplicaGroup::heal with what a checkpoint holds, `outer`'s state included);
/// the average of outer.contribution() over the members, a healed group counting for nothing; the commit; then
/// outer.apply(). A try that does not commit (a member failed) runs again with the groups left, so `step` (read anew
/// each try: a heal changes it) never repeats an inner step.
void synchronize(dist::ReplicaGroup& replicas, SemiSync& outer, const int64_t& step, const std::function<void()>& heal);

}  // namespace titan
