// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/mtp_loss.hpp"

#include <ATen/ATen.h>

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/multi_token_prediction.hpp"
#include "titan/train/run_context.hpp"

namespace titan {

MtpLoss::MtpLoss(const RunContext& run, torch::nn::Module& model) : run_(run), modules_(models::mtp_modules(model)) {
  if (modules_.empty()) return;
  const dist::Mesh& mesh = run.mesh();
  TITAN_CHECK_NOT_IMPLEMENTED(mesh.size("cp") == 1 && mesh.size("tp") == 1,
                              "[titan::MtpLoss] expected context_parallel_degree and tensor_parallel_degree 1 with "
                              "model.num_nextn_predict_layers > 0, got cp {} and tp {}. Set num_nextn_predict_layers "
                              "0, or use data and expert parallelism.",
                              mesh.size("cp"), mesh.size("tp"));
  // The next-token loss is a mean over the step's label positions: each module's summed cross-entropy takes the same
  // weight, the report's 1/T (its last positions, without a target in the sequence, add nothing).
  const JobConfig& c = run.config();
  const int64_t positions = c.training.local_batch_size * c.training.seq_len * run.grad_accum_steps() * run.dp_degree();
  for (const auto& m : modules_) m->loss_scale = 1.0 / static_cast<double>(positions);
}

void MtpLoss::start_step() const {
  at::NoGradGuard no_grad;
  for (const auto& m : modules_) m->loss.zero_();
}

std::optional<double> MtpLoss::step_loss() const {
  if (modules_.empty()) return std::nullopt;
  double sum = 0;
  for (const auto& m : modules_) sum += m->loss.item<double>();
  return run_.all_reduce_sum(sum, "dp_cp");
}

}  // namespace titan
