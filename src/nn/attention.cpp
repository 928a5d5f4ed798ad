// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/attention.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <utility>

#include "titan/core/error.hpp"
#include "titan/layout/module_hooks.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/kv_cache.hpp"
#include "titan/nn/sequence_attention.hpp"
#include "titan/nn/sink_attention.hpp"

namespace titan::nn {
namespace {
constexpr double kInStd = 0.02;
// torch.nn.init.trunc_normal_'s default absolute cut-offs, kept for parity with torchtitan.
constexpr double kCutLow = -2.0;
constexpr double kCutHigh = 2.0;
}  // namespace

Attention::Attention(int64_t dim, int64_t n_heads_, int64_t n_kv_heads_, const at::TensorOptions& options,
                     const AttentionOptions& extra)
    : n_heads(n_heads_),
      n_kv_heads(n_kv_heads_),
      head_dim(extra.head_dim > 0 ? extra.head_dim : dim / n_heads_),
      sliding_window(extra.sliding_window),
      rotary_dim(extra.rotary_dim > 0 ? extra.rotary_dim : head_dim),
      position_encoding(extra.position_encoding) {
  TITAN_CHECK_VALUE(extra.head_dim > 0 || dim % n_heads == 0,
                    "[titan::nn::Attention] expected dim divisible by n_heads, got dim={} "
                    "n_heads={}.",
                    dim, n_heads);
  TITAN_CHECK_VALUE(n_heads % n_kv_heads == 0,
                    "[titan::nn::Attention] expected n_heads divisible by "
                    "n_kv_heads, got n_heads={} n_kv_heads={}.",
                    n_heads, n_kv_heads);
  TITAN_CHECK_VALUE(extra.sliding_window >= 0, "[titan::nn::Attention] expected sliding_window >= 0 (0: none), got {}.",
                    extra.sliding_window);
  TITAN_CHECK_VALUE(rotary_dim > 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0,
                    "[titan::nn::Attention] expected an even rotary_dim in [2, head_dim = {}] (0: head_dim), got {}. "
                    "Fix the rotary fraction.",
                    head_dim, extra.rotary_dim);
  wq = register_module("wq", std::make_shared<Linear>(dim, n_heads * head_dim, options, extra.bias));
  wk = register_module("wk", std::make_shared<Linear>(dim, n_kv_heads * head_dim, options, extra.bias));
  wv = register_module("wv", std::make_shared<Linear>(dim, n_kv_heads * head_dim, options, extra.bias));
  wo = register_module("wo", std::make_shared<Linear>(n_heads * head_dim, dim, options, extra.bias));
  if (extra.output_gate) wg = register_module("wg", std::make_shared<Linear>(dim, n_heads * head_dim, options));
  if (extra.sinks) sinks = register_parameter("sinks", at::empty({n_heads}, options));
  if (extra.qk_norm) {
    q_norm = register_module(
        "q_norm", std::make_shared<RMSNorm>(head_dim, extra.qk_norm_eps, options, extra.qk_norm_unit_offset));
    k_norm = register_module(
        "k_norm", std::make_shared<RMSNorm>(head_dim, extra.qk_norm_eps, options, extra.qk_norm_unit_offset));
  }
}

at::Tensor Attention::forward(const at::Tensor& x, const RopeTables& rope, const AttentionContext& context) const {
  check_attention_context(context, "titan::nn::Attention");
  return parallel::module_call(*this, x, [&](const at::Tensor& in) {
    const int64_t bsz = in.size(0);
    const int64_t seq = in.size(1);
    // -1 heads: under tensor parallelism this rank holds n_heads/tp query and n_kv_heads/tp kv heads.
    at::Tensor q = wq->forward(in).view({bsz, seq, -1, head_dim});  // (B, S, H, HD)
    at::Tensor k = wk->forward(in).view({bsz, seq, -1, head_dim});  // (B, S, KVH, HD)
    at::Tensor v = wv->forward(in).view({bsz, seq, -1, head_dim});  // (B, S, KVH, HD)
    if (q_norm) {
      q = q_norm->forward(q);  // (B, S, H, HD)
      k = k_norm->forward(k);  // (B, S, KVH, HD)
    }
    q = rotate(q, rope, context.positions).transpose(1, 2);  // (B, H, S, HD)
    k = rotate(k, rope, context.positions).transpose(1, 2);  // (B, KVH, S, HD)
    v = v.transpose(1, 2);                                   // (B, KVH, S, HD)
    const at::Tensor out = attend(q, k, v, context);         // (B, H, S, HD)
    return project_out(out.transpose(1, 2).reshape({bsz, seq, -1}), in);
  });
}

at::Tensor Attention::rotate(const at::Tensor& x, const RopeTables& rope, const at::Tensor& positions) const {
  if (position_encoding != PositionEncoding::rope) return x;
  if (rotary_dim == head_dim) return apply_rope(x, rope, positions);
  return at::cat(
      {apply_rope(x.narrow(-1, 0, rotary_dim), rope, positions), x.narrow(-1, rotary_dim, head_dim - rotary_dim)},
      -1);  // (B, S, heads, HD)
}

at::Tensor Attention::project_out(const at::Tensor& out, const at::Tensor& x) const {
  if (!wg) return wo->forward(out);
  return wo->forward(out * at::sigmoid(wg->forward(x)));  // (B, S, D)
}

at::Tensor Attention::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const AttentionContext& context) const {
  if (!sinks.defined() && sliding_window == 0) return causal_attention(q, k, v, context);
  if (!sinks.defined()) return sink_attention(q, k, v, {}, sliding_window, context);
  return parallel::with_param(sinks,
                              [&](const at::Tensor& s) { return sink_attention(q, k, v, s, sliding_window, context); });
}

at::Tensor AttentionLayer::forward_cached(const at::Tensor&, const RopeTables&, const at::Tensor&, const at::Tensor&,
                                          KVCache&, int64_t) const {
  TITAN_CHECK_NOT_IMPLEMENTED(false,
                              "[titan::nn::AttentionLayer] expected an attention layer with a KV-cache forward, "
                              "got a {} without one. Implement forward_cached for it to generate.",
                              name());
}

at::Tensor Attention::forward_cached(const at::Tensor& x, const RopeTables& rope, const at::Tensor& positions,
                                     const at::Tensor& mask, KVCache& cache, int64_t layer) const {
  return parallel::module_call(*this, x, [&](const at::Tensor& in) {
    const int64_t bsz = in.size(0);
    const int64_t count = in.size(1);
    // -1 heads: a tensor-parallel rank holds its share of the heads (and caches only those).
    at::Tensor q = wq->forward(in).view({bsz, count, -1, head_dim});  // (B, S, H, HD)
    at::Tensor k = wk->forward(in).view({bsz, count, -1, head_dim});  // (B, S, KVH, HD)
    at::Tensor v = wv->forward(in).view({bsz, count, -1, head_dim});  // (B, S, KVH, HD)
    if (q_norm) {
      q = q_norm->forward(q);  // (B, S, H, HD)
      k = k_norm->forward(k);  // (B, S, KVH, HD)
    }
    q = rotate(q, rope, positions).transpose(1, 2);                         // (B, H, S, HD)
    k = rotate(k, rope, positions).transpose(1, 2);                         // (B, KVH, S, HD)
    const auto [keys, values] = cache.append(layer, k, v.transpose(1, 2));  // (B, KVH, T, HD)
    const at::Tensor out = sinks.defined() || sliding_window > 0
                               ? cached_sink_attention(q, keys, values, mask, sinks, sliding_window)
                               : cached_attention(q, keys, values, mask);   // (B, H, S, HD)
    return project_out(out.transpose(1, 2).reshape({bsz, count, -1}), in);  // (B, S, D)
  });
}

void Attention::init_weights(const InitSite& site, double out_std) {
  // torchtitan's gpt-oss (the biased attention) draws its input projections from the block's std too.
  const double in_std = wq->bias.defined() ? out_std : kInStd;
  const std::pair<const char*, Linear*> projections[] = {
      {"wq", wq.get()}, {"wk", wk.get()}, {"wv", wv.get()}, {"wo", wo.get()}, {"wg", wg.get()}};
  for (const auto& [name, linear] : projections) {
    if (linear == nullptr) continue;
    const double sd = linear == wo.get() ? out_std : in_std;
    trunc_normal_(linear->weight, site / fmt::format("{}.weight", name), 0.0, sd, kCutLow, kCutHigh);
    if (linear->bias.defined())
      trunc_normal_(linear->bias, site / fmt::format("{}.bias", name), 0.0, sd, kCutLow, kCutHigh);
  }
  if (sinks.defined()) trunc_normal_(sinks, site / "sinks", 0.0, out_std, kCutLow, kCutHigh);
  if (q_norm) q_norm->reset_parameters();
  if (k_norm) k_norm->reset_parameters();
}

FeedForward::FeedForward(int64_t dim, int64_t hidden_dim, const at::TensorOptions& options) {
  w1 = register_module("w1", std::make_shared<Linear>(dim, hidden_dim, options));
  w2 = register_module("w2", std::make_shared<Linear>(hidden_dim, dim, options));
  w3 = register_module("w3", std::make_shared<Linear>(dim, hidden_dim, options));
}

at::Tensor FeedForward::forward(const at::Tensor& x) const {
  return parallel::module_call(
      *this, x, [&](const at::Tensor& in) { return w2->forward(at::silu(w1->forward(in)) * w3->forward(in)); });
}

void FeedForward::init_weights(const InitSite& site, double out_std) {
  trunc_normal_(w1->weight, site / "w1.weight", 0.0, kInStd, kCutLow, kCutHigh);
  trunc_normal_(w2->weight, site / "w2.weight", 0.0, out_std, kCutLow, kCutHigh);
  trunc_normal_(w3->weight, site / "w3.weight", 0.0, out_std, kCutLow, kCutHigh);
}

}  // namespace titan::nn
