// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/gated_deltanet.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <utility>

#include "titan/core/error.hpp"
#include "titan/layout/module_hooks.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/nn/gated_delta_rule.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/kv_cache.hpp"

namespace titan::nn {
namespace {

constexpr double kProjectionStd = 0.02;
// HF's A ~ U[0.01, 16): the lower bound keeps log(A) finite.
constexpr double kDecayRateLow = 0.01;
constexpr double kDecayRateHigh = 16.0;

// The last K-1 inputs of a convolution after x: what the next step's window starts with.
at::Tensor last_inputs(const at::Tensor& history, const at::Tensor& x, int64_t kernel) {
  const at::Tensor all = history.defined() ? at::cat({history, x}, 1) : x;  // (B, K-1+S, C)
  if (all.size(1) >= kernel - 1) return all.narrow(1, all.size(1) - (kernel - 1), kernel - 1).contiguous();
  return at::constant_pad_nd(all, {0, 0, kernel - 1 - all.size(1), 0});  // (B, K-1, C)
}

}  // namespace

CausalConv1d::CausalConv1d(int64_t channels, int64_t kernel, const at::TensorOptions& options) {
  TITAN_CHECK_VALUE(channels > 0 && kernel > 0,
                    "[titan::nn::CausalConv1d] expected channels and kernel > 0, got {} and {}.", channels, kernel);
  weight = register_parameter("weight", at::empty({channels, kernel}, options));
}

at::Tensor CausalConv1d::forward(const at::Tensor& x, const at::Tensor& history, const at::Tensor& document_ids) const {
  return parallel::module_call(*this, x, [&](const at::Tensor& in) { return convolve(in, history, document_ids); });
}

at::Tensor CausalConv1d::convolve(const at::Tensor& x, const at::Tensor& history,
                                  const at::Tensor& document_ids) const {
  TITAN_CHECK_VALUE(!history.defined() || !document_ids.defined(),
                    "[titan::nn::CausalConv1d] expected no history with document ids, got both. Decode one document "
                    "per row.");
  return parallel::with_param(weight, [&](const at::Tensor& w) {
    const int64_t kernel = w.size(1);
    const int64_t seq = x.size(1);
    const at::Tensor in = history.defined()
                              ? at::cat({history.to(x.scalar_type()), x}, 1)
                              : at::constant_pad_nd(x, {0, 0, kernel - 1, 0});  // (B, K-1+S, C): zeros before the start
    // Tap j reads the input K-1-j tokens back: K shifted multiply-adds, which CPU runs far faster than a depthwise
    // at::conv1d (and its backward). With documents a tap reading another document's token reads zero: each
    // document convolved alone (the runs before the sequence are never a token's own; their inputs are zeros anyway).
    const at::Tensor runs = document_ids.defined()
                                ? at::constant_pad_nd(document_runs(document_ids), {kernel - 1, 0}, -1)
                                : at::Tensor();  // (B, K-1+S)
    at::Tensor out;                              // (B, S, C)
    for (int64_t j = 0; j < kernel; ++j) {
      at::Tensor tap = in.narrow(1, j, seq) * w.select(1, j);  // (B, S, C)
      if (runs.defined()) {
        tap = tap * runs.narrow(1, j, seq).eq(runs.narrow(1, kernel - 1, seq)).unsqueeze(-1).to(x.scalar_type());
      }
      out = out.defined() ? out + tap : tap;
    }
    return out;
  });
}

HeadDecay::HeadDecay(int64_t heads, const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({heads}, options));
}

at::Tensor HeadDecay::forward(const at::Tensor& a) const {
  return parallel::module_call(*this, a, [&](const at::Tensor& in) {
    return parallel::with_param(weight, [&](const at::Tensor& w) {
      return -w.to(at::kFloat).exp() * at::softplus(in.to(at::kFloat));  // (..., H)
    });
  });
}

GatedDeltaNet::GatedDeltaNet(int64_t dim, const GatedDeltaNetOptions& o, const at::TensorOptions& tensor_options)
    : options(o) {
  TITAN_CHECK_VALUE(o.n_key_heads > 0 && o.n_value_heads % o.n_key_heads == 0 && o.key_head_dim > 0 &&
                        o.value_head_dim > 0 && o.conv_kernel > 0 && o.chunk_size > 0,
                    "[titan::nn::GatedDeltaNet] expected value heads a multiple of key heads and positive head dims, "
                    "kernel and chunk size, got {} key heads, {} value heads, dk {}, dv {}, kernel {}, chunk {}. Fix "
                    "the linear attention's sizes.",
                    o.n_key_heads, o.n_value_heads, o.key_head_dim, o.value_head_dim, o.conv_kernel, o.chunk_size);
  const int64_t keys = o.n_key_heads * o.key_head_dim;
  const int64_t values = o.n_value_heads * o.value_head_dim;
  wq = register_module("wq", std::make_shared<Linear>(dim, keys, tensor_options));
  wk = register_module("wk", std::make_shared<Linear>(dim, keys, tensor_options));
  wv = register_module("wv", std::make_shared<Linear>(dim, values, tensor_options));
  wz = register_module("wz", std::make_shared<Linear>(dim, values, tensor_options));
  wb = register_module("wb", std::make_shared<Linear>(dim, o.n_value_heads, tensor_options));
  wa = register_module("wa", std::make_shared<Linear>(dim, o.n_value_heads, tensor_options, /*bias=*/true));
  conv_q = register_module("conv_q", std::make_shared<CausalConv1d>(keys, o.conv_kernel, tensor_options));
  conv_k = register_module("conv_k", std::make_shared<CausalConv1d>(keys, o.conv_kernel, tensor_options));
  conv_v = register_module("conv_v", std::make_shared<CausalConv1d>(values, o.conv_kernel, tensor_options));
  decay = register_module("decay", std::make_shared<HeadDecay>(o.n_value_heads, tensor_options));
  norm = register_module("norm", std::make_shared<RMSNorm>(o.value_head_dim, o.norm_eps, tensor_options));
  wo = register_module("wo", std::make_shared<Linear>(values, dim, tensor_options));
}

at::Tensor GatedDeltaNet::mix(const at::Tensor& x, const at::Tensor& document_ids, Carry* carry) const {
  const int64_t bsz = x.size(0);
  const int64_t seq = x.size(1);
  const int64_t kernel = options.conv_kernel;
  // -1 heads: under tensor parallelism a rank would hold its share of them.
  const auto convolved = [&](const Linear& proj, const CausalConv1d& conv, at::Tensor* history, int64_t head_dim) {
    const at::Tensor projected = proj.forward(x);  // (B, S, heads*hd)
    const at::Tensor out = at::silu(conv.forward(projected, history ? *history : at::Tensor(), document_ids));
    if (history) *history = last_inputs(*history, projected, kernel);
    return out.view({bsz, seq, -1, head_dim});  // (B, S, heads, hd)
  };
  const at::Tensor q = convolved(*wq, *conv_q, carry ? &carry->q : nullptr, options.key_head_dim);    // (B, S, Hk, dk)
  const at::Tensor k = convolved(*wk, *conv_k, carry ? &carry->k : nullptr, options.key_head_dim);    // (B, S, Hk, dk)
  const at::Tensor v = convolved(*wv, *conv_v, carry ? &carry->v : nullptr, options.value_head_dim);  // (B, S, Hv, dv)
  const at::Tensor beta = at::sigmoid(wb->forward(x));                                                // (B, S, Hv)
  const at::Tensor g = decay->forward(wa->forward(x));                                                // (B, S, Hv) fp32
  const DeltaRuleInputs rule{.q = l2_normalize(q.to(at::kFloat)) / std::sqrt(static_cast<double>(options.key_head_dim)),
                             .k = l2_normalize(k.to(at::kFloat)),
                             .v = v,
                             .g = g,
                             .beta = beta,
                             .initial_state = carry ? carry->state : at::Tensor(),
                             .document_ids = document_ids};
  DeltaRuleOutput r = carry && seq == 1 ? recurrent_gated_delta_rule(rule)
                                        : chunk_gated_delta_rule(rule, options.chunk_size);  // out (B, S, Hv, dv)
  if (carry) carry->state = std::move(r.state);
  const at::Tensor z = wz->forward(x).view({bsz, seq, -1, options.value_head_dim});  // (B, S, Hv, dv)
  // Norm, then gate, in fp32 (HF's RMSNormGated).
  const at::Tensor gated = norm->forward(r.out).to(at::kFloat) * at::silu(z.to(at::kFloat));  // (B, S, Hv, dv)
  return wo->forward(gated.to(x.scalar_type()).reshape({bsz, seq, -1}));                      // (B, S, D)
}

at::Tensor GatedDeltaNet::forward(const at::Tensor& x, const RopeTables&, const AttentionContext& context) const {
  check_attention_context(context, "titan::nn::GatedDeltaNet");
  TITAN_CHECK_NOT_IMPLEMENTED(context.sharding == nullptr,
                              "[titan::nn::GatedDeltaNet] expected whole sequences, got a context-parallel split. "
                              "Context parallelism of the recurrence (passing the state between ranks) is not built; "
                              "set parallelism.context_parallel_degree 1.");
  return parallel::module_call(*this, x, [&](const at::Tensor& in) { return mix(in, context.document_ids, nullptr); });
}

at::Tensor GatedDeltaNet::forward_cached(const at::Tensor& x, const RopeTables&, const at::Tensor&, const at::Tensor&,
                                         KVCache& cache, int64_t layer) const {
  return parallel::module_call(*this, x, [&](const at::Tensor& in) {
    at::Tensor input = in;  // (B, S, D)
    if (cache.pad().defined()) {
      // Left padding must leave the state as if the prompt began the row: zero inputs write nothing.
      const at::Tensor column = at::arange(cache.length(), cache.length() + in.size(1), cache.pad().options());
      const at::Tensor real = column.unsqueeze(0) >= cache.pad().unsqueeze(1);  // (B, S)
      input = in * real.unsqueeze(-1).to(in.device(), in.scalar_type());
    }
    Carry carry{.q = cache.recurrent_state(layer, 0),
                .k = cache.recurrent_state(layer, 1),
                .v = cache.recurrent_state(layer, 2),
                .state = cache.recurrent_state(layer, 3)};
    const at::Tensor out = mix(input, {}, &carry);
    cache.recurrent_state(layer, 0) = carry.q;
    cache.recurrent_state(layer, 1) = carry.k;
    cache.recurrent_state(layer, 2) = carry.v;
    cache.recurrent_state(layer, 3) = carry.state;
    return out;
  });
}

void GatedDeltaNet::init_weights(const InitSite& site, double out_std) {
  const std::pair<const char*, Linear*> projections[] = {{"wq", wq.get()}, {"wk", wk.get()}, {"wv", wv.get()},
                                                         {"wz", wz.get()}, {"wb", wb.get()}, {"wa", wa.get()}};
  for (const auto& [name, linear] : projections) {
    trunc_normal_(linear->weight, site / (std::string(name) + ".weight"), 0.0, kProjectionStd, -2.0, 2.0);
  }
  trunc_normal_(wo->weight, site / "wo.weight", 0.0, out_std, -2.0, 2.0);
  const double tap_std = 1.0 / std::sqrt(static_cast<double>(options.conv_kernel));
  const std::pair<const char*, CausalConv1d*> convs[] = {
      {"conv_q", conv_q.get()}, {"conv_k", conv_k.get()}, {"conv_v", conv_v.get()}};
  for (const auto& [name, conv] : convs) {
    trunc_normal_(conv->weight, site / (std::string(name) + ".weight"), 0.0, tap_std, -2.0 * tap_std, 2.0 * tap_std);
  }
  ones_(wa->bias);
  const InitSite rate = site / "decay.weight";
  const at::Tensor u = detail::counter_uniform(decay->weight, rate.seed(), rate.stream(), 1).squeeze(-1);  // [0, 1)
  detail::write_local(decay->weight, (kDecayRateLow + (kDecayRateHigh - kDecayRateLow) * u).log());
  norm->reset_parameters();
}

}  // namespace titan::nn
