// SPDX-License-Identifier: BSD-3-Clause
// Validation: every validation.freq steps, validation.steps batches (or the whole dataset) of validation.dataset,
// forward only, through the model as it trains (its pipeline, its context-parallel split, its loss on vocab
// shards); the token-mean loss over every rank. The Trainer logs it with the training metrics (console,
// metrics.jsonl, TensorBoard); a loop of your own calls the same:
//
//   titan::Validation validation(run, tokenizer);
//   if (validation.due(step)) metrics.log_validation(step, validation.run(model.step_model(), model.parallel()));
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace titan {
class RunContext;
class Parallelized;
struct StepModel;
namespace data {
class Tokenizer;
}

struct ValidationResult {
  /// Summed token cross-entropy over every rank's batches.
  double loss_sum = 0;
  /// Valid label tokens over every rank.
  int64_t tokens = 0;
  /// Microbatches this rank evaluated.
  int64_t batches = 0;
  double loss() const { return tokens > 0 ? loss_sum / static_cast<double>(tokens) : 0.0; }
};

class Validation {
 public:
  /// The validation set of the run's data-parallel rank; opens the dataset now, so a wrong path fails at start.
  Validation(const RunContext& run, std::shared_ptr<data::Tokenizer> tokenizer);

  /// True when step `step` ends with a validation run (validation.freq).
  bool due(int64_t step) const;
  /// One pass over the validation set (at most validation.steps batches) through `model`, summed over the ranks:
  /// every rank calls it. Leaves data-parallel units resharded.
  ValidationResult run(const StepModel& model, const Parallelized& parallel) const;

  /// Summed token cross-entropy of one batch: tokens (B, S), labels (B, S) -> loss sum.
  using LossSum = std::function<double(const at::Tensor& tokens, const at::Tensor& labels)>;
  /// The same pass with a loss of your own, on this rank only (no reduction).
  ValidationResult run(const LossSum& loss_sum) const;

 private:
  const RunContext& run_;
  std::shared_ptr<data::Tokenizer> tokenizer_;
};

}  // namespace titan
