// SPDX-License-Identifier: BSD-3-Clause
// The key/value cache of autoregressive decoding: each attention layer keeps the keys and values of
// every token it has seen, so a step computes q/k/v for the new tokens only and attends to the rest
// from the cache. A batch of prompts of different lengths is left-padded to one length: row b's
// first pad[b] columns are padding, masked as keys and skipped by RoPE (row b's first real token
// has position 0), so every row decodes in the same column and a step is one (B, 1) forward.
// A recurrent layer (nn::GatedDeltaNet) keeps its state here instead of keys and values. Inference only (no
// autograd); the training path never sees it.
//
//   nn::KVCache cache(model.args().n_layers, tokens.size(1) + max_new_tokens, pad);
//   at::Tensor logits = model.forward_cached(tokens, cache);   // prefill: (B, S, V)
//   logits = model.forward_cached(next, cache);                // one step: (B, 1, V)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace titan::nn {

class KVCache {
 public:
  /// A cache for `n_layers` attention layers and up to `capacity` columns (prompt + new tokens);
  /// `pad` (B) int64 is each row's left padding (undefined: none). K/V are allocated by each
  /// layer's first append (their head count is the layer's, a tensor-parallel rank's share).
  KVCache(int64_t n_layers, int64_t capacity, const at::Tensor& pad = {});

  /// Columns already filled (the column of the next token).
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  /// Each row's left padding: (B) int64, or undefined (none).
  const at::Tensor& pad() const { return pad_; }

  /// RoPE positions of `count` new columns: (B, count) int64, column minus the row's padding
  /// (clamped at 0 inside the padding), or (count) when there is no padding.
  at::Tensor positions(int64_t count, const at::Device& device) const;
  /// Which cached keys each new query may attend to: (B, 1, count, length() + count) bool, causal
  /// and off the padding (a padding query attends to itself only, so nothing becomes NaN).
  at::Tensor mask(int64_t count, const at::Device& device) const;

  /// Writes layer's k/v (B, KVH, S, HD) at columns [length(), length() + S) and returns the cached
  /// keys and values of columns [0, length() + S), each (B, KVH, length() + S, HD).
  std::pair<at::Tensor, at::Tensor> append(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  /// Marks `count` more columns filled (after every layer has appended them).
  void advance(int64_t count);

  /// Slot `slot` of a recurrent layer's state (Gated DeltaNet's: its convolutions' last inputs and the delta rule's
  /// state), kept beside the keys and values: undefined until the layer stores it, then replaced every step.
  at::Tensor& recurrent_state(int64_t layer, int64_t slot);

 private:
  int64_t capacity_ = 0;
  int64_t length_ = 0;
  at::Tensor pad_{};                // (B) int64
  std::vector<at::Tensor> keys_{};  // per layer (B, KVH, capacity, HD)
  std::vector<at::Tensor> values_{};
  std::vector<std::vector<at::Tensor>> states_{};  // per layer, per slot
};

/// Attention of q (B, H, S, HD) over all cached columns k, v (B, KVH, T, HD) with cache.mask (GQA
/// when KVH < H): (B, H, S, HD).
at::Tensor cached_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask);

}  // namespace titan::nn
