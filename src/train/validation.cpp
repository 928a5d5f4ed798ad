// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/validation.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "titan/core/log.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/nn/loss.hpp"
#include "titan/parallel/context_parallel.hpp"
#include "titan/parallel/data_parallel.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/train/data_setup.hpp"
#include "titan/train/run_context.hpp"
#include "titan/train/step.hpp"

namespace titan {

Validation::Validation(const RunContext& run, std::shared_ptr<data::Tokenizer> tokenizer)
    : run_(run), tokenizer_(std::move(tokenizer)) {
  build_validation_dataloader(run_.config(), tokenizer_, run_.dp_rank(), run_.dp_degree());
}

bool Validation::due(int64_t step) const { return step % run_.config().validation.freq == 0; }

ValidationResult Validation::run(const LossSum& loss_sum) const {
  at::NoGradGuard no_grad;
  const JobConfig& config = run_.config();
  const auto loader = build_validation_dataloader(config, tokenizer_, run_.dp_rank(), run_.dp_degree());
  ValidationResult r;
  const int64_t limit = config.validation.steps;
  while (limit < 0 || r.batches < limit) {
    std::optional<data::Batch> batch = loader->try_next();
    if (!batch) break;
    const at::Tensor labels = batch->labels.to(run_.device());  // (B, S)
    r.loss_sum += loss_sum(batch->input.to(run_.device()), labels);
    r.tokens += count_valid_tokens(labels);
    ++r.batches;
  }
  if (r.batches == 0) {
    log::warn("validation: dataset {} gave no full batch of {} x {} tokens; nothing validated",
              config.validation.dataset, config.validation.local_batch_size, config.validation.seq_len);
  }
  return r;
}

ValidationResult Validation::run(const StepModel& model, const Parallelized& parallel) const {
  const LossFn loss = parallel.loss_parallel() ? LossFn([&parallel](const at::Tensor& logits, const at::Tensor& y) {
    return parallel.cross_entropy_sum(logits, y);
  })
                                               : LossFn();
  ValidationResult r = run([&](const at::Tensor& tokens, const at::Tensor& labels) {
    const parallel::LocalBatch local = parallel.local_batch({.tokens = tokens, .labels = labels});
    if (parallel.pipeline())
      return parallel.pipeline()->evaluate(model.stage_forward, local.tokens, local.labels, loss, local.attention);
    const at::Tensor logits = model.forward(local.tokens, local.attention);  // (B, S/cp, V)
    return (loss ? loss(logits, local.labels) : cross_entropy_sum(logits, local.labels)).item<double>();
  });
  // Every dp rank validated its slice of each batch, every cp rank its part of the sequences.
  r.loss_sum = run_.all_reduce_sum(r.loss_sum, "dp_cp");
  r.tokens = static_cast<int64_t>(run_.all_reduce_sum(static_cast<double>(r.tokens), "dp"));
  if (parallel.data_parallel()) parallel.data_parallel()->reshard();  // the no-grad forward left units gathered
  return r;
}

}  // namespace titan
