// SPDX-License-Identifier: BSD-3-Clause
// A task end to end: its documents into token requests (eval/requests.hpp), scored by a model's forward
// (eval/scoring.hpp, over data-parallel ranks), into lm-eval's metrics (eval/metrics.hpp), with the throughput.
// titan-eval runs it on a checkpoint of any layout; a loop of your own calls it with its model:
//
//   const titan::eval::Task task = titan::eval::read_task("tasks/mc.yaml");
//   const titan::eval::TaskResult r = titan::eval::evaluate(task, *tokenizer,
//       [&](const at::Tensor& tokens) { return model->forward(tokens); }, {.max_length = 512});
//   titan::log::info("{}", titan::eval::format_results({r}));
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "titan/eval/metrics.hpp"
#include "titan/eval/scoring.hpp"
#include "titan/eval/task.hpp"

namespace titan::data {
class Tokenizer;
}

namespace titan::eval {

struct TaskResult {
  std::string task{};
  OutputType output_type = OutputType::multiple_choice;
  /// lm-eval's metrics, in the task's order.
  Metrics metrics{};
  /// Every document's scores, in the task's order.
  std::vector<DocScores> docs{};
  /// This rank's forwards and tokens.
  ScoringStats stats{};
  /// Wall time of tokenising and scoring.
  double seconds = 0;
};

/// `task` scored through `forward` (see ScoringOptions for the data-parallel split: every rank calls it).
TaskResult evaluate(const Task& task, const data::Tokenizer& tokenizer, const LogitsFn& forward,
                    const ScoringOptions& options);

/// One JSON object: task, output_type, metrics (name -> value), input and scored tokens, seconds, tokens/s; with
/// `docs`, each document's responses as [loglikelihood, greedy, tokens] (lm-eval's resps, with the continuation
/// tokens scored) and its per-document metrics (lm-eval's samples' acc, acc_norm, acc_bytes).
nlohmann::json result_json(const TaskResult& result, bool docs);

/// The results as a table for the console: task, metric, value, stderr.
std::string format_results(const std::vector<TaskResult>& results);

}  // namespace titan::eval
