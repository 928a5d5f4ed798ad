// SPDX-License-Identifier: BSD-3-Clause
// MtpLoss: what a training step does for a model's multi-token prediction (models/multi_token_prediction.hpp)
// besides forward and backward. Each module reads the labels of the microbatch it runs on (so a position the labels
// mask, -100, is no depth's target) and weighs its loss as the next-token loss is, by one over the step's valid labels.
// The step's MTP loss goes to the metrics apart from the next-token loss, so that curve stays comparable to a run
// without MTP. A model without MTP makes every call a no-op.
//
//   titan::MtpLoss mtp(run, model.model());
//   mtp.start_step(batch);
//   titan::forward_backward(parallel, mtp.labelled(step_model, batch, device), batch, mesh, device);
//   if (auto loss = mtp.step_loss()) metrics.add_scalar("loss_metrics/mtp_loss", *loss);
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <optional>
#include <vector>

namespace torch::nn {
class Module;
}
namespace titan {
class RunContext;
struct StepBatch;
struct StepModel;
namespace models {
class MultiTokenPrediction;
}

class MtpLoss {
 public:
  /// The MTP modules of `model`; refused under context and tensor parallelism (a sequence split over ranks would need
  /// its neighbours' tokens), which the model's sharding spec refuses already.
  MtpLoss(const RunContext& run, torch::nn::Module& model);
  /// Zeroes the modules' running losses and weighs a summed cross-entropy by one over batch.global_valid_tokens (the
  /// next-token loss's denominator): call before the step's first forward.
  void start_step(const StepBatch& batch) const;
  /// `model` whose forward first hands the modules the labels of the microbatch it runs (batch's, in their order, as
  /// forward_backward runs them), on `device`. Without MTP, `model` itself. The pipeline's stage_forward is left as it
  /// is: the model's sharding spec refuses MTP under pipeline parallelism.
  StepModel labelled(const StepModel& model, const StepBatch& batch, const at::Device& device) const;
  /// The step's mean depth loss (1/D sum_k L_k, lambda not applied) over the global batch: an all-reduce over dp_cp,
  /// so every rank calls it; nullopt without MTP.
  std::optional<double> step_loss() const;

 private:
  const RunContext& run_;
  std::vector<std::shared_ptr<models::MultiTokenPrediction>> modules_;
};

}  // namespace titan
