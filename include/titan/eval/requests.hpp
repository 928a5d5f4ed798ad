// SPDX-License-Identifier: BSD-3-Clause
// Documents into token requests, as lm-eval's causal-LM backend makes them: a continuation's tokens are those
// of context + continuation after the context's (trailing spaces of the context moved to the continuation), an
// empty context is the prefix token (BOS, else EOS), and a text scored whole is cut into rolling windows of
// max_length tokens, each predicting tokens no other window predicts.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "titan/eval/task.hpp"

namespace titan::data {
class Tokenizer;
}

namespace titan::eval {

/// The log-probability of `continuation` after `context`, in tokens.
struct TokenRequest {
  /// Conditioning tokens (never empty: at least the prefix token).
  std::vector<int64_t> context{};
  /// Tokens scored.
  std::vector<int64_t> continuation{};
};

/// The token every text is conditioned on when nothing precedes it: the tokenizer's BOS, else its EOS (lm-eval's
/// prefix_token_id). An error when it has neither.
int64_t prefix_token(const data::Tokenizer& tokenizer);

/// lm-eval's loglikelihood tokenisation of one (context, continuation) pair (`prefix` from prefix_token).
TokenRequest encode_pair(const data::Tokenizer& tokenizer, std::string_view context, std::string_view continuation,
                         int64_t prefix);

/// lm-eval's rolling windows over `tokens` (get_rolling_token_windows with context_len 1, then
/// make_disjoint_window): the first window predicts the first min(max_length, n) tokens after `prefix`, every
/// further one the next up-to-max_length tokens after the max_length - (its length) - ... tokens before them, so
/// each token is predicted once with as much context as fits.
std::vector<TokenRequest> rolling_windows(std::span<const int64_t> tokens, int64_t prefix, int64_t max_length);

/// The requests of one document, in lm-eval's order: one per choice (multiple_choice), one (loglikelihood), or its
/// rolling windows (loglikelihood_rolling; their scores add up to the document's).
std::vector<TokenRequest> doc_requests(const Task& task, const Doc& doc, const data::Tokenizer& tokenizer,
                                       int64_t prefix, int64_t max_length);

/// The tokens of `text` without the special tokens the tokenizer's post-processor adds (HF's
/// add_special_tokens=False): what lm-eval scores after an empty context.
std::vector<int64_t> encode_plain(const data::Tokenizer& tokenizer, std::string_view text);

}  // namespace titan::eval
