// SPDX-License-Identifier: BSD-3-Clause
// Choosing the next token from a model's logits: greedy (argmax) at temperature 0, otherwise a draw
// from softmax(logits / temperature) restricted to the top_k most likely tokens and to the smallest
// set whose probability reaches top_p (Hugging Face's order: temperature, top-k, top-p). The draw
// uses the caller's generator, so a seed reproduces a run.
//
//   at::Generator gen = nn::sampling_generator(seed);
//   at::Tensor next = nn::sample(logits.select(1, -1), {.temperature = 0.8, .top_k = 50}, gen);  // (B)
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace titan::nn {

struct SamplingConfig {
  /// Softmax temperature; 0 is greedy decoding (argmax).
  double temperature = 0.0;
  /// Keep only the k most likely tokens; 0 keeps all.
  int64_t top_k = 0;
  /// Keep the smallest set of most likely tokens whose probability reaches top_p; 1 keeps all.
  double top_p = 1.0;

  bool greedy() const { return temperature == 0.0; }
  /// Throws naming the flag (--temperature, --top-k, --top-p) when a value is out of range.
  void validate() const;
};

/// A CPU generator seeded with `seed` (the draws happen on CPU, wherever the logits are).
at::Generator sampling_generator(uint64_t seed);

/// Next token of each row of logits (B, V): (B) int64 on the logits' device.
at::Tensor sample(const at::Tensor& logits, const SamplingConfig& config, at::Generator& generator);

}  // namespace titan::nn
