// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/moe_balancing.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>

#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/moe.hpp"
#include "titan/parallel/expert_parallel.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/train/run_context.hpp"

namespace titan {

MoeBalancing::MoeBalancing(const RunContext& run, torch::nn::Module& model, const Parallelized& parallel) : run_(run) {
  // The expert-parallel layers the plan sharded over ep (their gradients reduced each step), or at ep = 1 every
  // MoE layer, only recorded.
  if (const parallel::ExpertParallel* ep = parallel.expert_parallel()) {
    moe_ = std::make_unique<parallel::ExpertParallel>(*ep);
  } else {
    moe_ = std::make_unique<parallel::ExpertParallel>(
        parallel::apply_expert_parallel(model, run.mesh(), {.moe_modules = parallel::moe_modules(model)}));
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    if (item.key().ends_with(".expert_bias")) expert_biases_.emplace_back(item.key(), item.value());
  }
  // The sequence-wise auxiliary loss as a mean over the step's sequences, as the cross-entropy is a mean over its
  // tokens: each rank's microbatches inject their sum, weighted by one over the global batch.
  const JobConfig& config = run.config();
  const int64_t sequences = config.training.local_batch_size * run.grad_accum_steps() * run.dp_degree();
  const dist::Mesh& mesh = run.mesh();
  for (const auto& layer : moe_->layers()) {
    if (layer->args.load_balance_loss_weight == 0.0) continue;
    // A sequence split over cp (or over tp by sequence parallelism) needs its counts summed over those ranks
    // before f_i is formed; that exchange is not built.
    TITAN_CHECK_NOT_IMPLEMENTED(mesh.size("cp") == 1 && mesh.size("tp") == 1,
                                "[titan::MoeBalancing] expected context_parallel_degree and tensor_parallel_degree 1 "
                                "with model.moe_load_balance_loss_weight > 0, got cp {} and tp {}: the sequence-wise "
                                "auxiliary loss of a sequence split over ranks is not built. Set the weight to 0 "
                                "(bias balancing still runs) or use data, pipeline and expert parallelism.",
                                mesh.size("cp"), mesh.size("tp"));
    layer->aux_loss_scale = 1.0 / static_cast<double>(sequences);
  }
}

MoeBalancing::~MoeBalancing() = default;

std::vector<at::Tensor> MoeBalancing::balance() const {
  // torchtitan's optimizer pre-step hook: each MoE layer's counts of this step's microbatches summed over dp x cp,
  // then its expert bias moved toward balance (outside autograd) and the counts zeroed.
  std::vector<at::Tensor> loads = moe_->update_expert_bias();  // (E) each
  // Expert-parallel experts without data parallelism of their own (a hand-built plan): their gradients summed over
  // the ranks holding the same experts before clipping measures them; titan::parallelize's FSDP over efsdp x
  // dp_replicate has reduce-scattered them already, and this is a no-op.
  moe_->reduce_expert_gradients();
  return loads;
}

double MoeBalancing::max_load_ratio(const std::vector<at::Tensor>& loads) const {
  double ratio = 0;
  for (const at::Tensor& load : loads) ratio = std::max(ratio, (load.max() / load.mean()).item<double>());
  // Each stage knows its own layers; a stage may have none.
  return run_.all_reduce_max(ratio, "pp");
}

}  // namespace titan
