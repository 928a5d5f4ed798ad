// SPDX-License-Identifier: BSD-3-Clause
#include "titan/eval/requests.hpp"

#include "titan/core/error.hpp"
#include "titan/data/tokenizer.hpp"

namespace titan::eval {
namespace {

std::vector<int64_t> encode(const data::Tokenizer& tokenizer, std::string_view text) {
  const std::vector<int32_t> ids = tokenizer.encode(text);
  return {ids.begin(), ids.end()};
}

}  // namespace

int64_t prefix_token(const data::Tokenizer& tokenizer) {
  if (const auto bos = tokenizer.bos_id()) return *bos;
  const auto eos = tokenizer.eos_id();
  TITAN_CHECK_VALUE(eos.has_value(),
                    "[titan::eval] expected the tokenizer to name a BOS or EOS token (the token an empty context and "
                    "every rolling window's first prediction are conditioned on), got neither. Set bos_token in its "
                    "tokenizer_config.json.");
  return *eos;
}

std::vector<int64_t> encode_plain(const data::Tokenizer& tokenizer, std::string_view text) {
  std::vector<int64_t> ids = encode(tokenizer, text);
  // What the post-processor adds around any text is what it gives the empty text (HF's template processors).
  const std::vector<int64_t> added = encode(tokenizer, "");
  if (!added.empty() && ids.size() >= added.size() && std::equal(added.begin(), added.end(), ids.begin()))
    ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(added.size()));
  return ids;
}

TokenRequest encode_pair(const data::Tokenizer& tokenizer, std::string_view context, std::string_view continuation,
                         int64_t prefix) {
  if (context.empty()) {
    std::vector<int64_t> tokens = encode_plain(tokenizer, continuation);
    TITAN_CHECK_VALUE(!tokens.empty(), "[titan::eval] expected a continuation with tokens, got '{}'.", continuation);
    // The prefix token conditions the first token, unless the continuation starts with it.
    if (tokens.front() == prefix) return {{prefix}, {tokens.begin() + 1, tokens.end()}};
    return {{prefix}, tokens};
  }
  // Spaces that end the context belong to the continuation's first word (lm-eval's _encode_pair).
  const size_t kept = context.find_last_not_of(" \t\n\r\f\v") + 1;
  std::string whole(context.substr(0, kept));
  const std::string moved(context.substr(kept));
  const std::vector<int64_t> context_tokens = encode(tokenizer, whole);
  whole += moved;
  whole += continuation;
  const std::vector<int64_t> whole_tokens = encode(tokenizer, whole);
  const size_t n = std::min(context_tokens.size(), whole_tokens.size());
  return {context_tokens, {whole_tokens.begin() + static_cast<std::ptrdiff_t>(n), whole_tokens.end()}};
}

std::vector<TokenRequest> rolling_windows(std::span<const int64_t> tokens, int64_t prefix, int64_t max_length) {
  TITAN_CHECK_VALUE(max_length >= 1, "[titan::eval] expected --max-length >= 1, got {}.", max_length);
  std::vector<TokenRequest> windows;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return windows;
  auto slice = [&](int64_t begin, int64_t end) {
    return std::vector<int64_t>(tokens.begin() + begin, tokens.begin() + end);
  };
  // The first window: the prefix, then tokens, predicting its first max_length tokens.
  const int64_t first = std::min(max_length, n);
  windows.push_back({{prefix}, slice(0, first)});
  // With context_len 1 a window predicts up to max_length tokens; its input is the max_length tokens before its
  // last one, of which those before its predictions are context (make_disjoint_window).
  for (int64_t predicted = first; predicted < n;) {
    const int64_t length = std::min(n - predicted, max_length);
    const int64_t end = predicted + length;
    windows.push_back({slice(end - max_length - 1, end - length), slice(end - length, end)});
    predicted = end;
  }
  return windows;
}

std::vector<TokenRequest> doc_requests(const Task& task, const Doc& doc, const data::Tokenizer& tokenizer,
                                       int64_t prefix, int64_t max_length) {
  switch (task.output_type) {
    case OutputType::multiple_choice: {
      std::vector<TokenRequest> out;
      for (const std::string& choice : doc.choices)
        out.push_back(encode_pair(tokenizer, doc.context, task.target_delimiter + choice, prefix));
      return out;
    }
    case OutputType::loglikelihood:
      return {encode_pair(tokenizer, doc.context, doc.target, prefix)};
    case OutputType::loglikelihood_rolling:
      return rolling_windows(encode(tokenizer, doc.target), prefix, max_length);
  }
  return {};
}

}  // namespace titan::eval
