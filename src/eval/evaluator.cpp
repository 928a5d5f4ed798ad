// SPDX-License-Identifier: BSD-3-Clause
#include "titan/eval/evaluator.hpp"

#include <chrono>

#include "titan/eval/requests.hpp"

namespace titan::eval {

TaskResult evaluate(const Task& task, const data::Tokenizer& tokenizer, const LogitsFn& forward,
                    const ScoringOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t prefix = prefix_token(tokenizer);
  // Every document's requests in one list (all of a task's requests share batches), and where each doc's begin.
  std::vector<TokenRequest> requests;
  std::vector<size_t> first;
  for (const Doc& doc : task.docs) {
    first.push_back(requests.size());
    for (TokenRequest& r : doc_requests(task, doc, tokenizer, prefix, options.max_length))
      requests.push_back(std::move(r));
  }
  first.push_back(requests.size());
  TaskResult result{.task = task.name, .output_type = task.output_type};
  const std::vector<Score> scores = score(requests, forward, options, &result.stats);
  for (size_t d = 0; d < task.docs.size(); ++d) {
    DocScores doc;
    if (task.output_type == OutputType::loglikelihood_rolling) {
      // A rolling document's windows add up to one log-likelihood (lm-eval sums them).
      Score whole{.loglikelihood = 0, .greedy = false};
      for (size_t i = first[d]; i < first[d + 1]; ++i) {
        whole.loglikelihood += scores[i].loglikelihood;
        whole.tokens += scores[i].tokens;
      }
      doc.responses.push_back(whole);
    } else {
      doc.responses.assign(scores.begin() + static_cast<std::ptrdiff_t>(first[d]),
                           scores.begin() + static_cast<std::ptrdiff_t>(first[d + 1]));
    }
    doc.metrics = doc_metrics(task, task.docs[d], doc.responses);
    result.docs.push_back(std::move(doc));
  }
  result.metrics = task_metrics(task, result.docs);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace titan::eval
