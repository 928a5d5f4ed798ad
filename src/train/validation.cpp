// SPDX-License-Identifier: BSD-3-Clause
// Validator (see train/detail/validation.hpp).
#include "titan/train/detail/validation.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "titan/core/log.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/metrics/metrics.hpp"
#include "titan/nn/loss.hpp"
#include "titan/train/data_setup.hpp"

namespace titan::detail {

Validator::Validator(const JobConfig& config, std::shared_ptr<data::Tokenizer> tokenizer, int64_t dp_rank,
                     int64_t dp_degree)
    : config_(config), tokenizer_(std::move(tokenizer)), dp_rank_(dp_rank), dp_degree_(dp_degree) {
  // Open the dataset now, so a wrong path fails at startup rather than at the first validation.
  build_validation_dataloader(config_, tokenizer_, dp_rank_, dp_degree_);
}

bool Validator::due(int64_t step) const { return step % config_.validation.freq == 0; }

ValidationResult Validator::run(const LossSum& loss_sum, const at::Device& device) const {
  at::NoGradGuard no_grad;
  const auto loader = build_validation_dataloader(config_, tokenizer_, dp_rank_, dp_degree_);
  ValidationResult r;
  const int64_t limit = config_.validation.steps;
  while (limit < 0 || r.batches < limit) {
    std::optional<data::Batch> batch = loader->try_next();
    if (!batch) break;
    const at::Tensor labels = batch->labels.to(device);  // (B, S)
    r.loss_sum += loss_sum(batch->input.to(device), labels);
    r.tokens += count_valid_tokens(labels);
    ++r.batches;
  }
  if (r.batches == 0) {
    log::warn("validation: dataset {} gave no full batch of {} x {} tokens; nothing validated",
              config_.validation.dataset, config_.validation.local_batch_size, config_.validation.seq_len);
  }
  return r;
}

}  // namespace titan::detail
