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

/// One document's scores: its requests' (a rolling document's windows added into one).
struct DocScores {
  std::vector<Score> responses{};
  /// loglikelihood_rolling: tokens scored (for token_perplexity).
  int64_t tokens = 0;
};

/// A task's metrics in its metric order, each mean followed by its _stderr.
using Metrics = std::vector<std::pair<std::string, double>>;

/// Unicode code points of UTF-8 `text` (Python's len(str)).
int64_t count_chars(std::string_view text);
/// Words as lm-eval counts them: len(re.split(r"\s+", text)), empty pieces at either end included.
int64_t count_words(std::string_view text);

/// The predicted choice of a multiple-choice document under `metric` (acc, acc_norm or acc_bytes): the first
/// index of the largest log-likelihood, normalised as the metric says.
int64_t predicted_choice(const Doc& doc, const DocScores& scores, std::string_view metric);

/// The task's metrics from every document's scores (in task.docs order).
Metrics task_metrics(const Task& task, const std::vector<DocScores>& docs);

}  // namespace titan::eval
