// SPDX-License-Identifier: BSD-3-Clause
// MtpLoss: what a training step does for a model's multi-token prediction (models/multi_token_prediction.hpp)
// besides forward and backward. Each module reads the labels of the microbatch it runs on (so a position the labels
// mask, -100, is no depth's target) and weighs its loss as the next-token loss is, by one over the step's valid labels.
// The step's MTP loss goes to the metrics apart from the next-token loss, so that curve stays comparable to a run
// without MTP. A model without MTP makes every call a no-op.
//
// Under pipeline parallelism the depths run on the last stage, which neither receives the tokens nor holds the
// embedding: labelled hands that stage each microbatch's tokens, and the stage holds a copy of the first stage's
// tok_embeddings (MultiTokenPrediction::embedding), as Megatron keeps a tied embedding on the first and last stage.
// Both copies start equal (the same init; the checkpoint's one key), their gradients are summed after the backward
// (sum_embedding_grads) and the grad norm counts the weight once (norm_copies), so they step alike and stay equal.
//
//   titan::MtpLoss mtp(run, model.model());
//   mtp.start_step(batch);
//   titan::forward_backward(parallel, mtp.labelled(step_model, batch, device, parallel.pipeline()), batch, mesh,
//                           device);
//   mtp.sum_embedding_grads(parallel.pipeline());
//   titan::optimizer_step(optimizer, lr, max_norm, mesh, mtp.norm_copies());
//   if (auto loss = mtp.step_loss()) metrics.add_scalar("loss_metrics/mtp_loss", *loss);
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <optional>
#include <vector>

namespace at {
class Tensor;
}
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
namespace parallel {
class Pipeline;
}

/// The key of the embedding the last stage's copy copies, in the optimizer and the checkpoint (parameter_names).
inline constexpr const char* kMtpEmbeddingKey = "tok_embeddings.weight";

/// `model` whose forwards first hand `modules` the labels of the microbatch they run (batch's, in their order, as
/// forward_backward runs them), on `device`; under `pipeline` (null: none) the last stage's forwards with grad get the
/// rows of the microbatch each runs, its tokens beside its labels (the schedules run a stage's forwards in microbatch
/// order, each over the next microbatch_size rows). Without modules, `model` itself.
StepModel mtp_labelled(const StepModel& model,
                       const std::vector<std::shared_ptr<models::MultiTokenPrediction>>& modules,
                       const StepBatch& batch, const at::Device& device, const parallel::Pipeline* pipeline);
/// The last stage's copies of the first stage's embedding in `model` (MultiTokenPrediction::embedding): the
/// parameters the grad norm leaves out (optimizer_step's copies). Empty where the part embeds or has no depths.
std::vector<at::Tensor> mtp_embedding_copies(const torch::nn::Module& model);
/// Under `pipeline` (null: nothing to do), after the step's last backward: the gradients of the first stage's
/// tok_embeddings and of the last stage's copy summed (Pipeline::sum_first_last_stage_grads). Every pp rank of a
/// model with multi-token prediction calls it (the first stage's part does not hold the depths).
void sum_mtp_embedding_grads(const torch::nn::Module& model, const parallel::Pipeline* pipeline);

class MtpLoss {
 public:
  /// The MTP modules of `model` (under pipeline parallelism: those of this rank's stages; one all-reduce over pp tells
  /// every rank whether there are any); refused under context and tensor parallelism (a sequence split over ranks would
  /// need its neighbours' tokens), which the model's sharding spec refuses already.
  MtpLoss(const RunContext& run, torch::nn::Module& model);
  /// Zeroes the modules' running losses and weighs a summed cross-entropy by one over batch.global_valid_tokens (the
  /// next-token loss's denominator): call before the step's first forward.
  void start_step(const StepBatch& batch) const;
  /// mtp_labelled with this model's modules.
  StepModel labelled(const StepModel& model, const StepBatch& batch, const at::Device& device,
                     const parallel::Pipeline* pipeline = nullptr) const;
  /// sum_mtp_embedding_grads with the model (a no-op without multi-token prediction).
  void sum_embedding_grads(const parallel::Pipeline* pipeline) const;
  /// mtp_embedding_copies of the model.
  const std::vector<at::Tensor>& norm_copies() const { return copies_; }
  /// The step's mean depth loss (1/D sum_k L_k, lambda not applied) over the global batch: an all-reduce over dp_cp
  /// (and pp, whose last stage holds the depths), so every rank calls it; nullopt without MTP.
  std::optional<double> step_loss() const;

 private:
  const RunContext& run_;
  torch::nn::Module& model_;
  /// Some part of the model has the depths: known on every pipeline rank, holding them or not.
  bool on_ = false;
  std::vector<std::shared_ptr<models::MultiTokenPrediction>> modules_;
  std::vector<at::Tensor> copies_;
};

}  // namespace titan
