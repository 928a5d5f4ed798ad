// SPDX-License-Identifier: BSD-3-Clause
// MoeBalancing: what a training step does for a model's MoE layers besides forward and backward: before the
// optimizer step, each layer's expert loads of the step summed over the ranks that saw its tokens and its expert
// bias moved toward balance (auxiliary-loss-free balancing, torchtitan's optimizer pre-step hook), expert gradients
// reduced where no data parallelism did; the load ratio for the metrics; the sequence-wise auxiliary loss's scale;
// the expert biases a checkpoint holds. A model without MoE layers makes every call a no-op, so a loop calls it
// unconditionally and never silently loses the bias update.
//
//   titan::MoeBalancing moe(run, model.model(), model.parallel());
//   ... forward and backward ...
//   const auto loads = moe.balance();                                     // before optimizer_step
//   metrics.add_scalar("moe/max_load_ratio", moe.max_load_ratio(loads));
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}
namespace titan {
class RunContext;
class Parallelized;
namespace parallel {
class ExpertParallel;
}

class MoeBalancing {
 public:
  /// The MoE layers of `model` (as `parallel` sharded them, or whole); sets each layer's sequence-wise auxiliary
  /// loss scale to one over the step's sequences (refused under cp or tp > 1, whose split sequences' counts are not
  /// summed). Call after parallelize.
  MoeBalancing(const RunContext& run, torch::nn::Module& model, const Parallelized& parallel);
  ~MoeBalancing();
  MoeBalancing(const MoeBalancing&) = delete;
  MoeBalancing& operator=(const MoeBalancing&) = delete;

  /// After backward, before the optimizer step: each layer's (E) load summed over dp x cp, its expert bias updated
  /// and its counts zeroed; expert gradients that no data parallelism reduced summed over the ranks holding the same
  /// experts. Returns the loads of the layers with a bias.
  std::vector<at::Tensor> balance() const;
  /// The most loaded expert over the mean load, the worst layer of `loads` over every pipeline stage (an all-reduce
  /// over pp: every pp rank calls it); 0 without loads anywhere.
  double max_load_ratio(const std::vector<at::Tensor>& loads) const;
  /// (FQN, (E) fp32 buffer) of each expert bias this rank holds: part of the training state.
  const std::vector<std::pair<std::string, at::Tensor>>& expert_biases() const { return expert_biases_; }

 private:
  const RunContext& run_;
  std::unique_ptr<parallel::ExpertParallel> moe_;
  std::vector<std::pair<std::string, at::Tensor>> expert_biases_;
};

}  // namespace titan
