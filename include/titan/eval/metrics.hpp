// SPDX-License-Identifier: BSD-3-Clause
// lm-eval's metrics from the scores of each document's requests:
//   multiple_choice   acc       argmax of the choices' log-likelihoods is the gold one
//                     acc_norm  the same after dividing each by its choice's length in characters (Unicode code
//                               points, Python's len; lm-eval 0.4's acc_norm)
//                     acc_bytes the same per UTF-8 byte
//   loglikelihood     perplexity exp(-mean log-likelihood); acc: the continuation is the greedy one
//   loglikelihood_rolling  word_perplexity exp(-sum ll / sum words), byte_perplexity exp(-sum ll / sum bytes),
//                     bits_per_byte -sum ll / sum bytes / ln 2; titan adds token_perplexity exp(-sum ll / sum tokens)
// Means come with lm-eval's standard error (sample standard deviation / sqrt(n)) as <metric>_stderr.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "titan/eval/scoring.hpp"
#include "titan/eval/task.hpp"

namespace titan::eval {

/// Metric values by name, in the task's metric order.
using Metrics = std::vector<std::pair<std::string, double>>;

/// One document's scores: its requests' (a rolling document's windows added into one), and the values of the
/// task's per-document metrics (lm-eval's samples: acc, acc_norm, acc_bytes as 0 or 1).
struct DocScores {
  std::vector<Score> responses{};
  Metrics metrics{};
};

/// Unicode code points of UTF-8 `text` (Python's len(str)).
int64_t count_chars(std::string_view text);
/// Words as lm-eval counts them: len(re.split(r"\s+", text)), empty pieces at either end included.
int64_t count_words(std::string_view text);

/// The predicted choice of a multiple-choice document under `metric` (acc, acc_norm or acc_bytes): the first
/// index of the largest log-likelihood, normalised as the metric says.
int64_t predicted_choice(const Doc& doc, const std::vector<Score>& responses, std::string_view metric);

/// The per-document metric values of `doc` (acc, acc_norm, acc_bytes of the task's metrics; none for
/// loglikelihood_rolling, whose metrics are ratios of sums).
Metrics doc_metrics(const Task& task, const Doc& doc, const std::vector<Score>& responses);

/// The task's metrics from every document's scores (in task.docs order); means are followed by their _stderr.
Metrics task_metrics(const Task& task, const std::vector<DocScores>& docs);

}  // namespace titan::eval
