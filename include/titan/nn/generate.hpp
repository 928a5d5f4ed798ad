// SPDX-License-Identifier: BSD-3-Clause
// Autoregressive generation for any model with a cached forward (Llama3::forward_cached): the
// prompts are left-padded into one batch, prefilled in one forward, then decoded one token per step
// (nn/kv_cache.hpp); each step's token is chosen by nn::sample. A row stops at EOS; the loop stops
// when every row has, or after max_new_tokens.
//
//   nn::CachedForward step = [&](const at::Tensor& t, nn::KVCache& c) { return model.forward_cached(t, c); };
//   nn::Generation out = nn::generate(step, model.args().n_layers, {{1, 15, 27}, {1, 9}}, {.max_new_tokens = 32});
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "titan/nn/sampling.hpp"

namespace titan::dist {
class ProcessGroup;
}

namespace titan::nn {

class KVCache;

/// tokens (B, S) as the next S columns of the cache -> logits (B, S, V).
using CachedForward = std::function<at::Tensor(const at::Tensor& tokens, KVCache& cache)>;

struct GenerateConfig {
  /// Most tokens generated per prompt.
  int64_t max_new_tokens = 64;
  /// How each token is chosen (greedy by default).
  SamplingConfig sampling{};
  /// Seed of the sampling generator (unused when greedy).
  uint64_t seed = 0;
  /// The token that ends a sequence (kept as its last token); -1: none, always max_new_tokens.
  int64_t eos_id = -1;
  /// The token left padding is filled with (masked, never attended to).
  int64_t pad_id = 0;
  /// Keep each step's logits (B, V) in Generation::logits (tests compare them).
  bool keep_logits = false;
};

struct Generation {
  /// The new tokens of each prompt, EOS included when it came.
  std::vector<std::vector<int64_t>> tokens{};
  /// With keep_logits, the logits each step sampled from, float32 (B, V): step 0 is the prompts'
  /// last column, step i the logits after i new tokens.
  std::vector<at::Tensor> logits{};
};

/// Generates continuations of `prompts` (token ids, each non-empty) with a model of `n_layers`
/// attention layers on `device`. Under tensor parallelism pass the tp group: every rank computes
/// the same logits and takes rank 0's tokens, so the ranks never drift apart.
Generation generate(const CachedForward& forward, int64_t n_layers, const std::vector<std::vector<int64_t>>& prompts,
                    const GenerateConfig& config, const at::Device& device = at::kCPU,
                    const dist::ProcessGroup* group = nullptr);

}  // namespace titan::nn
