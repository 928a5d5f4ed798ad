// SPDX-License-Identifier: BSD-3-Clause
// MtpLoss: what a training step does for a model's multi-token prediction (models/multi_token_prediction.hpp)
// besides forward and backward. Each module's loss is weighted as the next-token loss is, by one over the label
// positions of an optimizer step. The step's MTP loss goes to the metrics apart from the next-token loss, so that curve
// stays comparable to a run without MTP. A model without MTP makes every call a no-op.
//
//   titan::MtpLoss mtp(run, model.model());
//   mtp.start_step();  ... forward and backward ...
//   if (auto loss = mtp.step_loss()) metrics.add_scalar("loss_metrics/mtp_loss", *loss);
#pragma once

#include <memory>
#include <optional>
#include <vector>

namespace torch::nn {
class Module;
}
namespace titan {
class RunContext;
namespace models {
class MultiTokenPrediction;
}

class MtpLoss {
 public:
  /// The MTP modules of `model`; refused under context and tensor parallelism (a sequence split over ranks would need
  /// its neighbours' tokens), which the model's sharding spec refuses already.
  MtpLoss(const RunContext& run, torch::nn::Module& model);
  /// Zeroes the modules' running losses: call before the step's first forward.
  void start_step() const;
  /// The step's mean depth loss (1/D sum_k L_k, lambda not applied) over the global batch: an all-reduce over dp_cp,
  /// so every rank calls it; nullopt without MTP.
  std::optional<double> step_loss() const;

 private:
  const RunContext& run_;
  std::vector<std::shared_ptr<models::MultiTokenPrediction>> modules_;
};

}  // namespace titan
