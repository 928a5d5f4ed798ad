// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/mtp_loss.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <memory>
#include <utility>

#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/multi_token_prediction.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/train/run_context.hpp"
#include "titan/train/step.hpp"

namespace titan {
namespace {

using MtpModules = std::vector<std::shared_ptr<models::MultiTokenPrediction>>;

// Sets the modules' inputs for one forward and clears them however it ends: a later forward (another batch's) must
// not read these.
class MtpInputs {
 public:
  MtpInputs(const MtpModules& modules, const at::Tensor& labels, const at::Tensor& tokens) : modules_(modules) {
    for (const auto& m : modules_) {
      m->labels = labels;
      m->tokens = tokens;
    }
  }
  ~MtpInputs() {
    for (const auto& m : modules_) {
      m->labels = at::Tensor();
      m->tokens = at::Tensor();
    }
  }
  MtpInputs(const MtpInputs&) = delete;
  MtpInputs& operator=(const MtpInputs&) = delete;

 private:
  const MtpModules& modules_;
};

}  // namespace

StepModel mtp_labelled(const StepModel& model, const MtpModules& modules, const StepBatch& batch,
                       const at::Device& device, const parallel::Pipeline* pipeline) {
  if (modules.empty()) return model;
  StepModel out = model;
  if (model.forward) {
    auto next = std::make_shared<size_t>(0);  // the microbatch the next forward runs
    out.forward = [inner = model.forward, modules, &batch, device, next](const at::Tensor& tokens,
                                                                         const nn::AttentionContext& context) {
      TITAN_CHECK(*next < batch.microbatches.size(),
                  "[titan::MtpLoss] expected at most {} forwards in the step, one per microbatch, got another. Run "
                  "labelled's model through forward_backward with the batch it was made for.",
                  batch.microbatches.size());
      const at::Tensor labels = batch.microbatches[(*next)++].labels.to(device, /*non_blocking=*/true);  // (B, S)
      const MtpInputs inputs(modules, labels, at::Tensor());
      return inner(tokens, context);
    };
  }
  if (model.stage_forward && pipeline != nullptr && pipeline->has_last_stage()) {
    const int64_t last = pipeline->stages().back();
    // (microbatch, first row) of the last stage's next forward: the pipeline cuts each microbatch into row blocks.
    auto next = std::make_shared<std::pair<size_t, int64_t>>(0, 0);
    out.stage_forward = [inner = model.stage_forward, modules, &batch, device, last, next](
                            int64_t stage, const at::Tensor& x, const nn::AttentionContext& context) {
      if (stage != last || !c10::GradMode::is_enabled()) return inner(stage, x, context);
      auto& [index, row] = *next;
      TITAN_CHECK(index < batch.microbatches.size(),
                  "[titan::MtpLoss] expected the last stage's forwards to cover the step's {} microbatches once, got "
                  "another. Run labelled's model through forward_backward with the batch it was made for.",
                  batch.microbatches.size());
      const Microbatch& mb = batch.microbatches[index];
      const int64_t rows = x.size(0);
      TITAN_CHECK(row + rows <= mb.input.size(0),
                  "[titan::MtpLoss] expected the last stage's forward of rows {}..{} within microbatch {}'s {} rows, "
                  "got past them. Make pipeline_parallel_microbatch_size divide the local batch.",
                  row, row + rows, index, mb.input.size(0));
      const MtpInputs inputs(modules, mb.labels.narrow(0, row, rows).to(device, /*non_blocking=*/true),
                             mb.input.narrow(0, row, rows).to(device, /*non_blocking=*/true));  // (rows, S) each
      row += rows;
      if (row == mb.input.size(0)) {
        ++index;
        row = 0;
      }
      return inner(stage, x, context);
    };
  }
  return out;
}

std::vector<at::Tensor> mtp_embedding_copies(const torch::nn::Module& model) {
  std::vector<at::Tensor> copies;
  for (const auto& m : models::mtp_modules(model)) {
    if (m->embedding) copies.push_back(m->embedding->weight);
  }
  return copies;
}

void sum_mtp_embedding_grads(const torch::nn::Module& model, const parallel::Pipeline* pipeline) {
  if (pipeline == nullptr) return;
  const std::vector<at::Tensor> copies = mtp_embedding_copies(model);
  const auto params = model.named_parameters(/*recurse=*/true);
  const at::Tensor* original = params.find(kMtpEmbeddingKey);
  TITAN_CHECK(copies.size() <= 1 && !(original != nullptr && !copies.empty()),
              "[titan::MtpLoss] expected one copy of the embedding on a pipeline's last stage, and none beside "
              "tok_embeddings, got {} copies{}. Build the model part with the stage's modules.",
              copies.size(), original != nullptr ? " beside tok_embeddings" : "");
  pipeline->sum_first_last_stage_grads(original != nullptr ? *original
                                       : copies.empty()    ? at::Tensor()
                                                           : copies.front());
}

MtpLoss::MtpLoss(const RunContext& run, torch::nn::Module& model)
    : run_(run), model_(model), modules_(models::mtp_modules(model)), copies_(mtp_embedding_copies(model)) {
  // Under a pipeline only the last stage's part holds the depths: every pp rank learns whether some part does.
  on_ = run.all_reduce_max(modules_.empty() ? 0.0 : 1.0, "pp") > 0;
  if (!on_) return;
  const dist::Mesh& mesh = run.mesh();
  TITAN_CHECK_NOT_IMPLEMENTED(mesh.size("cp") == 1 && mesh.size("tp") == 1,
                              "[titan::MtpLoss] expected context_parallel_degree and tensor_parallel_degree 1 with "
                              "model.num_nextn_predict_layers > 0, got cp {} and tp {}. Set num_nextn_predict_layers "
                              "0, or use data, pipeline and expert parallelism.",
                              mesh.size("cp"), mesh.size("tp"));
}

void MtpLoss::start_step(const StepBatch& batch) const {
  // The next-token loss is a mean over the step's valid labels: each module's summed cross-entropy takes the same
  // weight, the report's 1/T, so an MTP target weighs what a next-token target does (Megatron's per-token loss).
  for (const auto& m : modules_) m->loss_scale = 1.0 / static_cast<double>(batch.global_valid_tokens);
  at::NoGradGuard no_grad;
  for (const auto& m : modules_) m->loss.zero_();
}

StepModel MtpLoss::labelled(const StepModel& model, const StepBatch& batch, const at::Device& device,
                            const parallel::Pipeline* pipeline) const {
  return mtp_labelled(model, modules_, batch, device, pipeline);
}

void MtpLoss::sum_embedding_grads(const parallel::Pipeline* pipeline) const {
  if (on_) sum_mtp_embedding_grads(model_, pipeline);
}

std::optional<double> MtpLoss::step_loss() const {
  if (!on_) return std::nullopt;
  double sum = 0;
  for (const auto& m : modules_) sum += m->loss.item<double>();
  // Only the last stage's ranks hold the depths: the others add 0 over pp.
  return run_.all_reduce_sum(run_.all_reduce_sum(sum, "dp_cp"), "pp");
}

}  // namespace titan
