// SPDX-License-Identifier: BSD-3-Clause
// Evaluation during training: every eval.interval steps, the lm-eval tasks of eval.tasks scored through the model
// as it trains (its FSDP units, its TP styles; vocab-sharded logits gathered under loss parallelism), the batches
// split over the data-parallel ranks, by titan-eval's path (eval/evaluator.hpp): the same numbers titan-eval gives
// on that step's checkpoint. The Trainer logs them with the training metrics (console, metrics.jsonl,
// TensorBoard) as eval/<task>/<metric>; a loop of your own calls the same:
//
//   titan::Evaluation evaluation(run, tokenizer);
//   if (evaluation.due(step)) metrics.log_record(step, "eval", evaluation.run(model.step_model(), model.parallel()));
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/eval/evaluator.hpp"

namespace titan {
class RunContext;
class Parallelized;
struct StepModel;

class Evaluation {
 public:
  /// Reads eval.tasks now, so a bad task file fails at the start; refuses pipeline and context parallelism (a
  /// ConfigError naming eval.interval).
  Evaluation(const RunContext& run, std::shared_ptr<data::Tokenizer> tokenizer);
  ~Evaluation();

  /// True when step `step` ends with an evaluation (eval.interval).
  bool due(int64_t step) const;
  /// Every task scored through `model`; every rank calls it. Leaves data-parallel units resharded.
  std::vector<eval::TaskResult> run(const StepModel& model, const Parallelized& parallel) const;
  /// The results as "eval/<task>/<metric>" values, for MetricsProcessor::log_record.
  static std::vector<std::pair<std::string, double>> scalars(const std::vector<eval::TaskResult>& results);

 private:
  const RunContext& run_;
  std::shared_ptr<data::Tokenizer> tokenizer_;
  std::vector<eval::Task> tasks_;
};

}  // namespace titan
