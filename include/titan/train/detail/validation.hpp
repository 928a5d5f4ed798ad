// SPDX-License-Identifier: BSD-3-Clause
// Validation for the trainer: every validation.freq steps, validation.steps batches (or the whole
// dataset) of validation.dataset, forward only; the token-mean loss and its perplexity are logged with
// the training metrics (console and metrics.jsonl).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

#include "titan/core/config.hpp"
#include "titan/nn/loss.hpp"

namespace titan {
namespace data {
class Tokenizer;
}  // namespace data
}  // namespace titan

namespace titan::detail {

struct ValidationResult {
  double loss_sum = 0;  ///< summed token cross-entropy of this rank (all-reduce before dividing when dp > 1)
  int64_t tokens = 0;   ///< valid label tokens of this rank
  int64_t batches = 0;  ///< microbatches evaluated
  double loss() const { return tokens > 0 ? loss_sum / double(tokens) : 0.0; }
};

class Validator {
 public:
  Validator(const JobConfig& config, std::shared_ptr<data::Tokenizer> tokenizer, int64_t dp_rank, int64_t dp_degree);

  /// True when step `step` ends with a validation run.
  bool due(int64_t step) const;
  /// Summed token cross-entropy of one batch: tokens (B, S), labels (B, S) -> loss sum.
  using LossSum = std::function<double(const at::Tensor& tokens, const at::Tensor& labels)>;
  /// Runs the validation set from its start (one pass, at most validation.steps batches).
  ValidationResult run(const LossSum& loss_sum, const at::Device& device) const;

 private:
  JobConfig config_;
  std::shared_ptr<data::Tokenizer> tokenizer_;
  int64_t dp_rank_, dp_degree_;
};

}  // namespace titan::detail
