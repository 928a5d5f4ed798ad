// SPDX-License-Identifier: BSD-3-Clause
// Token requests scored by a causal language model: each request's input is (context + continuation) without its
// last token, cut to the last max_length tokens, and its score is the sum of the continuation's log-probabilities
// (log-softmax in float64 of the model's logits) and whether greedy decoding gives the continuation. Requests are
// batched longest first, right-padded; over data-parallel ranks each rank scores every dp_size-th batch and the
// scores are summed across them, with equal forward counts on every rank (FSDP gathers in each forward).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "titan/eval/requests.hpp"

namespace titan::eval {

/// A causal LM's forward for scoring: tokens (B, S) int64 -> logits (B, S, V) over the whole vocabulary.
using LogitsFn = std::function<at::Tensor(const at::Tensor& tokens)>;

/// One request's result (lm-eval's (loglikelihood, is_greedy)).
struct Score {
  /// Sum of the continuation tokens' log-probabilities.
  double loglikelihood = 0;
  /// Every continuation token is the argmax of its position's logits.
  bool greedy = false;
  /// Continuation tokens scored.
  int64_t tokens = 0;
};

struct ScoringOptions {
  /// The longest input a forward sees (lm-eval's max_length); longer requests lose their oldest context tokens.
  int64_t max_length = 2048;
  /// Requests per forward.
  int64_t batch_size = 8;
  /// Where the tokens go.
  c10::Device device = c10::kCPU;
  /// This rank's place among the data-parallel ranks and their number: each scores every dp_size-th batch.
  int64_t dp_rank = 0;
  int64_t dp_size = 1;
  /// Sums a float64 tensor over the data-parallel ranks in place; empty with one rank.
  std::function<void(at::Tensor&)> all_reduce_sum{};
};

/// What scoring did, for throughput: forwards run and tokens fed on this rank.
struct ScoringStats {
  int64_t forwards = 0;
  /// Tokens of the requests' inputs (padding not counted).
  int64_t input_tokens = 0;
  /// Continuation tokens scored.
  int64_t scored_tokens = 0;
};

/// The score of every request, in the order given, on every rank. Every data-parallel rank calls it with the
/// same requests. An error names a continuation longer than max_length.
std::vector<Score> score(const std::vector<TokenRequest>& requests, const LogitsFn& forward,
                         const ScoringOptions& options, ScoringStats* stats = nullptr);

}  // namespace titan::eval
