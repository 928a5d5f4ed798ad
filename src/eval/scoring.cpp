// SPDX-License-Identifier: BSD-3-Clause
#include "titan/eval/scoring.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <numeric>

#include "titan/core/error.hpp"

namespace titan::eval {
namespace {

// One request's model input: (context + continuation)[-(max_length + 1):][:-1] (lm-eval's causal input).
std::vector<int64_t> input_of(const TokenRequest& r, int64_t max_length) {
  std::vector<int64_t> all = r.context;
  all.insert(all.end(), r.continuation.begin(), r.continuation.end());
  const int64_t keep = std::min<int64_t>(static_cast<int64_t>(all.size()), max_length + 1);
  return {all.end() - keep, all.end() - 1};
}

}  // namespace

std::vector<Score> score(const std::vector<TokenRequest>& requests, const LogitsFn& forward,
                         const ScoringOptions& options, ScoringStats* stats) {
  TITAN_CHECK_VALUE(options.batch_size >= 1, "[titan::eval] expected --batch-size >= 1, got {}.", options.batch_size);
  TITAN_CHECK_VALUE(options.dp_size >= 1 && options.dp_rank >= 0 && options.dp_rank < options.dp_size,
                    "[titan::eval] expected a data-parallel rank in [0, {}), got {}.", options.dp_size,
                    options.dp_rank);
  at::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(requests.size());
  std::vector<std::vector<int64_t>> inputs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const TokenRequest& r = requests[static_cast<size_t>(i)];
    TITAN_CHECK_VALUE(!r.context.empty() && !r.continuation.empty(),
                      "[titan::eval] expected a request with context and continuation tokens, got {} and {}.",
                      r.context.size(), r.continuation.size());
    TITAN_CHECK_VALUE(static_cast<int64_t>(r.continuation.size()) <= options.max_length,
                      "[titan::eval] expected continuations of at most --max-length {} tokens, got one of {}. Raise "
                      "--max-length (up to the model's longest sequence) or shorten the choice.",
                      options.max_length, r.continuation.size());
    inputs[static_cast<size_t>(i)] = input_of(r, options.max_length);
  }
  // Longest first (lm-eval's order): a batch pads to its first request.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return inputs[static_cast<size_t>(a)].size() > inputs[static_cast<size_t>(b)].size();
  });
  const int64_t batches = (n + options.batch_size - 1) / options.batch_size;
  // Every rank runs the same number of forwards; one past its share reruns a one-token input.
  const int64_t rounds = (batches + options.dp_size - 1) / options.dp_size;
  at::Tensor results = at::zeros({n, 2}, at::kDouble);  // (request, [loglikelihood, greedy])
  auto acc = results.accessor<double, 2>();
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t batch = round * options.dp_size + options.dp_rank;
    if (batch >= batches) {
      forward(at::zeros({1, 1}, at::TensorOptions().dtype(at::kLong).device(options.device)));
      if (stats) ++stats->forwards;
      continue;
    }
    const int64_t begin = batch * options.batch_size, end = std::min(n, begin + options.batch_size);
    const int64_t width = static_cast<int64_t>(inputs[static_cast<size_t>(order[static_cast<size_t>(begin)])].size());
    at::Tensor tokens = at::zeros({end - begin, width}, at::kLong);  // (B, S), right-padded
    auto t = tokens.accessor<int64_t, 2>();
    for (int64_t row = 0; row < end - begin; ++row) {
      const auto& in = inputs[static_cast<size_t>(order[static_cast<size_t>(begin + row)])];
      for (size_t s = 0; s < in.size(); ++s) t[row][static_cast<int64_t>(s)] = in[s];
    }
    const at::Tensor logits = forward(tokens.to(options.device));  // (B, S, V)
    if (stats) ++stats->forwards;
    for (int64_t row = 0; row < end - begin; ++row) {
      const int64_t i = order[static_cast<size_t>(begin + row)];
      const TokenRequest& r = requests[static_cast<size_t>(i)];
      const int64_t length = static_cast<int64_t>(inputs[static_cast<size_t>(i)].size());
      const int64_t scored = static_cast<int64_t>(r.continuation.size());
      // The positions whose next token is a continuation token: the input's last `scored`.
      const at::Tensor rows = logits[row].slice(0, length - scored, length).to(at::kCPU, at::kDouble);  // (C, V)
      const at::Tensor logp = at::log_softmax(rows, -1);                                                // (C, V)
      const at::Tensor target = at::tensor(r.continuation, at::kLong).unsqueeze(1);                     // (C, 1)
      acc[i][0] = logp.gather(1, target).sum().item<double>();
      acc[i][1] = at::equal(rows.argmax(-1), target.squeeze(1)) ? 1.0 : 0.0;
      if (stats) {
        stats->input_tokens += length;
        stats->scored_tokens += scored;
      }
    }
  }
  if (options.dp_size > 1) {
    TITAN_CHECK(static_cast<bool>(options.all_reduce_sum),
                "[titan::eval] expected ScoringOptions::all_reduce_sum with dp_size {} > 1, got none.",
                options.dp_size);
    options.all_reduce_sum(results);
  }
  std::vector<Score> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)] = {
        .loglikelihood = acc[i][0],
        .greedy = acc[i][1] > 0.5,
        .tokens = static_cast<int64_t>(requests[static_cast<size_t>(i)].continuation.size())};
  }
  return out;
}

}  // namespace titan::eval
