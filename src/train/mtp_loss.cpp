// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/mtp_loss.hpp"

#include <ATen/ATen.h>

#include <memory>

#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/multi_token_prediction.hpp"
#include "titan/train/run_context.hpp"
#include "titan/train/step.hpp"

namespace titan {

MtpLoss::MtpLoss(const RunContext& run, torch::nn::Module& model) : run_(run), modules_(models::mtp_modules(model)) {
  if (modules_.empty()) return;
  const dist::Mesh& mesh = run.mesh();
  TITAN_CHECK_NOT_IMPLEMENTED(mesh.size("cp") == 1 && mesh.size("tp") == 1,
                              "[titan::MtpLoss] expected context_parallel_degree and tensor_parallel_degree 1 with "
                              "model.num_nextn_predict_layers > 0, got cp {} and tp {}. Set num_nextn_predict_layers "
                              "0, or use data and expert parallelism.",
                              mesh.size("cp"), mesh.size("tp"));
}

void MtpLoss::start_step(const StepBatch& batch) const {
  // The next-token loss is a mean over the step's valid labels: each module's summed cross-entropy takes the same
  // weight, the report's 1/T, so an MTP target weighs what a next-token target does (Megatron's per-token loss).
  for (const auto& m : modules_) m->loss_scale = 1.0 / static_cast<double>(batch.global_valid_tokens);
  at::NoGradGuard no_grad;
  for (const auto& m : modules_) m->loss.zero_();
}

StepModel MtpLoss::labelled(const StepModel& model, const StepBatch& batch, const at::Device& device) const {
  if (modules_.empty() || !model.forward) return model;
  StepModel out = model;
  auto next = std::make_shared<size_t>(0);  // the microbatch the next forward runs
  out.forward = [inner = model.forward, modules = modules_, &batch, device, next](const at::Tensor& tokens,
                                                                                  const nn::AttentionContext& context) {
    TITAN_CHECK(*next < batch.microbatches.size(),
                "[titan::MtpLoss] expected at most {} forwards in the step, one per microbatch, got another. Run "
                "labelled's model through forward_backward with the batch it was made for.",
                batch.microbatches.size());
    const at::Tensor labels = batch.microbatches[(*next)++].labels.to(device, /*non_blocking=*/true);  // (B, S)
    for (const auto& m : modules) m->labels = labels;
    // Cleared however the forward ends: a later forward (another batch's) must not read these.
    struct Clear {
      const std::vector<std::shared_ptr<models::MultiTokenPrediction>>& modules;
      ~Clear() {
        for (const auto& m : modules) m->labels = at::Tensor();
      }
    } clear{modules};
    return inner(tokens, context);
  };
  return out;
}

std::optional<double> MtpLoss::step_loss() const {
  if (modules_.empty()) return std::nullopt;
  double sum = 0;
  for (const auto& m : modules_) sum += m->loss.item<double>();
  return run_.all_reduce_sum(sum, "dp_cp");
}

}  // namespace titan
