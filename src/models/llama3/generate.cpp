// SPDX-License-Identifier: BSD-3-Clause
// Llama3::forward_cached: the decoding forward over a KV cache. Same layers and weights as
// forward(), through the same module_call/with_param points (so a tensor-parallel plan applies), but
// attention reads and extends the cache and RoPE takes each row's positions past its left padding.
#include <ATen/ATen.h>

#include "titan/core/error.hpp"
#include "titan/layout/module_hooks.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/kv_cache.hpp"

namespace titan::llama3 {

at::Tensor Llama3::forward_cached(const at::Tensor& tokens, nn::KVCache& cache) const {
  TITAN_CHECK_VALUE(tokens.dim() == 2 && cache.length() + tokens.size(1) <= seq_len_,
                    "[titan::llama3::forward_cached] expected tokens (B, S) with {} cached + S <= {} (the RoPE "
                    "tables' length), got {}. Build the model with a seq_len covering prompt and new tokens.",
                    cache.length(), seq_len_, c10::str(tokens.sizes()));
  TITAN_CHECK(tok_embeddings && norm && static_cast<int64_t>(layers.size()) == args_.n_layers,
              "[titan::llama3::forward_cached] expected the whole model, got a part of {} blocks. Decoding runs "
              "without pipeline parallelism.",
              layers.size());
  TITAN_CHECK(rope_.freqs_cis.defined(),
              "[titan::llama3::forward_cached] expected a model on a real device, got one on meta. Build it with a "
              "device and load its weights.");
  at::NoGradGuard no_grad;
  const int64_t bsz = tokens.size(0);
  const int64_t count = tokens.size(1);
  const at::Tensor positions = cache.positions(count, tokens.device());  // (B, S) or (S) int64
  const at::Tensor mask = cache.mask(count, tokens.device());            // (B or 1, 1, S, T) bool
  at::Tensor h = tok_embeddings->forward(tokens);                        // (B, S, D)
  for (const auto& layer : layers) {
    const nn::Attention& attention = *layer->attention;
    const int64_t head_dim = attention.head_dim;
    const at::Tensor attended =
        parallel::module_call(attention, layer->attention_norm->forward(h), [&](const at::Tensor& in) {
          // -1 heads: a tensor-parallel rank holds its share of the heads (and caches only those).
          at::Tensor q = attention.wq->forward(in).view({bsz, count, -1, head_dim});        // (B, S, H, HD)
          at::Tensor k = attention.wk->forward(in).view({bsz, count, -1, head_dim});        // (B, S, KVH, HD)
          at::Tensor v = attention.wv->forward(in).view({bsz, count, -1, head_dim});        // (B, S, KVH, HD)
          q = nn::apply_rope(q, rope_, positions).transpose(1, 2);                          // (B, H, S, HD)
          k = nn::apply_rope(k, rope_, positions).transpose(1, 2);                          // (B, KVH, S, HD)
          const auto [keys, values] = cache.append(layer->layer_id, k, v.transpose(1, 2));  // (B, KVH, T, HD)
          const at::Tensor out = nn::cached_attention(q, keys, values, mask);               // (B, H, S, HD)
          return attention.wo->forward(out.transpose(1, 2).reshape({bsz, count, -1}));      // (B, S, D)
        });
    h = h + attended;
    h = h + layer->feed_forward->forward(layer->ffn_norm->forward(h));  // (B, S, D)
  }
  cache.advance(count);
  h = norm->forward(h);                   // (B, S, D)
  if (output) return output->forward(h);  // (B, S, V)
  return parallel::with_param(tok_embeddings->weight,
                              [&](const at::Tensor& w) { return at::linear(h, w); });  // (B, S, V)
}

}  // namespace titan::llama3
