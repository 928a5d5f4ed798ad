// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/kv_cache.hpp"

#include <ATen/ATen.h>

#include "titan/core/error.hpp"

namespace titan::nn {

KVCache::KVCache(int64_t n_layers, int64_t capacity, const at::Tensor& pad)
    : capacity_(capacity),
      pad_(pad),
      keys_(static_cast<size_t>(n_layers)),
      values_(static_cast<size_t>(n_layers)),
      states_(static_cast<size_t>(n_layers)) {
  TITAN_CHECK_VALUE(n_layers > 0 && capacity > 0,
                    "[titan::nn::KVCache] expected n_layers > 0 and capacity > 0, got {} and {}.", n_layers, capacity);
  TITAN_CHECK_VALUE(!pad.defined() || (pad.dim() == 1 && pad.scalar_type() == at::kLong),
                    "[titan::nn::KVCache] expected pad of shape (B) int64, got {} {}.",
                    pad.defined() ? c10::str(pad.sizes()) : "undefined",
                    pad.defined() ? c10::toString(pad.scalar_type()) : "");
}

at::Tensor KVCache::positions(int64_t count, const at::Device& device) const {
  at::Tensor columns = at::arange(length_, length_ + count, at::TensorOptions().dtype(at::kLong).device(device));
  if (!pad_.defined()) return columns;                                        // (S)
  return (columns.unsqueeze(0) - pad_.to(device).unsqueeze(1)).clamp_min(0);  // (B, S)
}

at::Tensor KVCache::mask(int64_t count, const at::Device& device) const {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor query = at::arange(length_, length_ + count, opts).view({count, 1});  // (S, 1)
  const at::Tensor key = at::arange(0, length_ + count, opts).view({1, -1});             // (1, T)
  at::Tensor allowed = key <= query;                                                     // (S, T)
  if (!pad_.defined()) return allowed.view({1, 1, count, -1});
  const at::Tensor pad = pad_.to(device).view({-1, 1, 1});  // (B, 1, 1)
  // Padding keys are hidden; a padding query sees only itself (its output is never used).
  allowed = (allowed.unsqueeze(0) & (key.unsqueeze(0) >= pad)) | (key.unsqueeze(0) == query.unsqueeze(0));
  return allowed.unsqueeze(1);  // (B, 1, S, T)
}

std::pair<at::Tensor, at::Tensor> KVCache::append(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  TITAN_CHECK_VALUE(layer >= 0 && layer < static_cast<int64_t>(keys_.size()),
                    "[titan::nn::KVCache] expected a layer in [0, {}), got {}.", keys_.size(), layer);
  const int64_t count = k.size(2);
  TITAN_CHECK_VALUE(length_ + count <= capacity_,
                    "[titan::nn::KVCache] expected at most {} columns (the cache's capacity), got {} + {}. "
                    "Build the cache with room for the prompt and every new token.",
                    capacity_, length_, count);
  at::Tensor& keys = keys_[static_cast<size_t>(layer)];
  at::Tensor& values = values_[static_cast<size_t>(layer)];
  if (!keys.defined()) {
    keys = at::zeros({k.size(0), k.size(1), capacity_, k.size(3)}, k.options());    // (B, KVH, T, HD)
    values = at::zeros({v.size(0), v.size(1), capacity_, v.size(3)}, v.options());  // (B, KVH, T, HD)
  }
  keys.narrow(2, length_, count).copy_(k);
  values.narrow(2, length_, count).copy_(v);
  return {keys.narrow(2, 0, length_ + count), values.narrow(2, 0, length_ + count)};
}

void KVCache::advance(int64_t count) { length_ += count; }

at::Tensor& KVCache::recurrent_state(int64_t layer, int64_t slot) {
  TITAN_CHECK_VALUE(layer >= 0 && layer < static_cast<int64_t>(states_.size()) && slot >= 0,
                    "[titan::nn::KVCache] expected a layer in [0, {}) and a slot >= 0, got layer {} slot {}.",
                    states_.size(), layer, slot);
  std::vector<at::Tensor>& slots = states_[static_cast<size_t>(layer)];
  if (slot >= static_cast<int64_t>(slots.size())) slots.resize(static_cast<size_t>(slot + 1));
  return slots[static_cast<size_t>(slot)];
}

at::Tensor cached_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/false,
                                          /*scale=*/std::nullopt, /*enable_gqa=*/q.size(1) != k.size(1));
}

}  // namespace titan::nn
