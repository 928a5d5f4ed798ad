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
#include <utility>
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

/// What self-speculative decoding did (generate_speculative).
struct SpeculativeStats {
  /// Tokens the draft modules proposed.
  int64_t drafted = 0;
  /// Drafted tokens the model's own greedy choice confirmed.
  int64_t accepted = 0;
  /// Forwards of the main model (one a step, the first included).
  int64_t forwards = 0;
  /// Tokens generated (EOS included).
  int64_t generated = 0;
  /// accepted / drafted (0 without drafts).
  double accepted_rate() const { return drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0; }
  /// generated / forwards: what one main-model forward yields (1 for plain decoding).
  double tokens_per_forward() const { return forwards > 0 ? static_cast<double>(generated) / forwards : 0.0; }
};

struct Generation {
  /// The new tokens of each prompt, EOS included when it came.
  std::vector<std::vector<int64_t>> tokens{};
  /// With keep_logits, the logits each step sampled from, float32 (B, V): step 0 is the prompts'
  /// last column, step i the logits after i new tokens.
  std::vector<at::Tensor> logits{};
  /// generate_speculative's counts (zero from generate).
  SpeculativeStats speculative{};
};

/// A model that drafts the tokens after a sequence itself (DeepSeek-V3's multi-token prediction modules).
struct DraftingModel {
  /// tokens (1, T) -> the last block's output (1, T, D) and the logits (1, T, V); no cache, no autograd.
  std::function<std::pair<at::Tensor, at::Tensor>(const at::Tensor& tokens)> forward{};
  /// The forward's hidden (1, T-1, D) at tokens' first T-1 positions, tokens (1, T) -> drafts (1, depth) of the
  /// tokens after them.
  std::function<at::Tensor(const at::Tensor& hidden, const at::Tensor& tokens)> draft{};
  /// Tokens drafted a step.
  int64_t depth = 0;
};

/// Generates continuations of `prompts` (token ids, each non-empty) with a model of `n_layers`
/// attention layers on `device`. Under tensor parallelism pass the tp group: every rank computes
/// the same logits and takes rank 0's tokens, so the ranks never drift apart.
Generation generate(const CachedForward& forward, int64_t n_layers, const std::vector<std::vector<int64_t>>& prompts,
                    const GenerateConfig& config, const at::Device& device = at::kCPU,
                    const dist::ProcessGroup* group = nullptr);

/// Greedy generation by self-speculative decoding: each step drafts up to model.depth tokens after the sequence,
/// verifies them with one forward over the sequence and the drafts, and keeps the drafts the model's own argmax
/// agrees with plus the argmax after the last of them. The tokens are greedy decoding's (Generation::speculative
/// counts how many drafts held). Each prompt is decoded alone and every verification recomputes its whole sequence
/// (no KV cache to roll back). Refuses sampling: a draft is checked against one token, the argmax. keep_logits
/// keeps nothing.
Generation generate_speculative(const DraftingModel& model, const std::vector<std::vector<int64_t>>& prompts,
                                const GenerateConfig& config, const at::Device& device = at::kCPU);

}  // namespace titan::nn
