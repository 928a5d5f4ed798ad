// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/sampling.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <limits>

#include "titan/core/error.hpp"

namespace titan::nn {

void SamplingConfig::validate() const {
  TITAN_CHECK_VALUE(temperature >= 0.0, "[titan::nn::sample] expected --temperature >= 0 (0 is greedy), got {}.",
                    temperature);
  TITAN_CHECK_VALUE(top_k >= 0, "[titan::nn::sample] expected --top-k >= 0 (0 keeps every token), got {}.", top_k);
  TITAN_CHECK_VALUE(top_p > 0.0 && top_p <= 1.0,
                    "[titan::nn::sample] expected --top-p in (0, 1] (1 keeps every token), got {}.", top_p);
}

at::Generator sampling_generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

at::Tensor sample(const at::Tensor& logits, const SamplingConfig& config, at::Generator& generator) {
  TITAN_CHECK_VALUE(logits.dim() == 2, "[titan::nn::sample] expected logits of shape (B, V), got {}.",
                    c10::str(logits.sizes()));
  config.validate();
  if (config.greedy()) return logits.argmax(-1);  // (B)
  const double lowest = -std::numeric_limits<double>::infinity();
  at::Tensor scores = logits.to(at::kCPU, at::kFloat) / config.temperature;  // (B, V)
  if (config.top_k > 0 && config.top_k < scores.size(-1)) {
    const at::Tensor kth = std::get<0>(scores.topk(config.top_k, -1)).narrow(-1, config.top_k - 1, 1);  // (B, 1)
    scores = scores.masked_fill(scores < kth, lowest);
  }
  if (config.top_p < 1.0) {
    // Sorted ascending, a token is dropped when the tokens less likely than it and itself together
    // hold at most 1 - top_p of the probability (the most likely token always stays).
    auto [sorted, order] = scores.sort(/*dim=*/-1, /*descending=*/false);  // (B, V) each
    const at::Tensor cumulative = sorted.softmax(-1).cumsum(-1);           // (B, V)
    at::Tensor drop = cumulative <= 1.0 - config.top_p;                    // (B, V), in sorted order
    drop.select(-1, -1).fill_(false);
    scores = scores.masked_fill(drop.scatter(-1, order, drop), lowest);
  }
  const at::Tensor probs = scores.softmax(-1);                                                         // (B, V)
  return at::multinomial(probs, 1, /*replacement=*/false, generator).squeeze(-1).to(logits.device());  // (B)
}

}  // namespace titan::nn
