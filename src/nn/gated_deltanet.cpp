// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/gated_deltanet.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <utility>
#include <vector>

#include "titan/core/error.hpp"
#include "titan/layout/module_hooks.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/nn/detail/state_passing.hpp"
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
  return parallel::with_param(weight, [&](const at::Tensor& w) {
    const int64_t kernel = w.size(1);
    const int64_t seq = x.size(1);
    const int64_t window = history.defined() ? kernel - 1 + seq : seq;
    TITAN_CHECK_VALUE(!document_ids.defined() || (document_ids.dim() == 2 && document_ids.size(1) == window),
                      "[titan::nn::CausalConv1d] expected document ids (B, {}) ({}), got {}. Give the history's "
                      "tokens' ids before x's.",
                      window, history.defined() ? "the history's K-1 tokens, then x's" : "x's tokens",
                      c10::str(document_ids.sizes()));
    const at::Tensor in = history.defined()
                              ? at::cat({history.to(x.scalar_type()), x}, 1)
                              : at::constant_pad_nd(x, {0, 0, kernel - 1, 0});  // (B, K-1+S, C): zeros before the start
    // Tap j reads the input K-1-j tokens back: K shifted multiply-adds, which CPU runs far faster than a depthwise
    // at::conv1d (and its backward). With documents a tap reading another document's token reads zero: each
    // document convolved alone (the runs before the sequence are never a token's own; their inputs are zeros anyway).
    at::Tensor runs;  // (B, K-1+S)
    if (document_ids.defined()) {
      runs = history.defined() ? document_runs(document_ids)
                               : at::constant_pad_nd(document_runs(document_ids), {kernel - 1, 0}, -1);
    }
    at::Tensor out;  // (B, S, C)
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

at::Tensor GatedDeltaNet::mix(const at::Tensor& x, const Documents& documents, Carry* carry,
                              const Passing* passing) const {
  const int64_t bsz = x.size(0);
  const int64_t seq = x.size(1);
  const int64_t kernel = options.conv_kernel;
  // Every projection first: under context parallelism they run while the previous rank's carry is on its way.
  const at::Tensor projected_q = wq->forward(x);                                     // (B, S, Hk*dk)
  const at::Tensor projected_k = wk->forward(x);                                     // (B, S, Hk*dk)
  const at::Tensor projected_v = wv->forward(x);                                     // (B, S, Hv*dv)
  const at::Tensor z = wz->forward(x).view({bsz, seq, -1, options.value_head_dim});  // (B, S, Hv, dv)
  const at::Tensor beta = at::sigmoid(wb->forward(x));                               // (B, S, Hv)
  const at::Tensor g = decay->forward(wa->forward(x));                               // (B, S, Hv) fp32
  // -1 heads: under tensor parallelism a rank holds its share of them.
  const int64_t value_heads = projected_v.size(2) / options.value_head_dim;
  const at::ScalarType compute = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const std::vector<int64_t> carried{bsz * value_heads * options.key_head_dim * options.value_head_dim,
                                     bsz * (kernel - 1) * projected_q.size(2), bsz * (kernel - 1) * projected_k.size(2),
                                     bsz * (kernel - 1) * projected_v.size(2)};
  if (passing) {
    // One message: the state, then the three convolutions' last inputs, in the compute dtype.
    const at::Tensor flat =
        detail::receive_from_previous(*passing->sharding->group, carried[0] + carried[1] + carried[2] + carried[3],
                                      x.options().dtype(compute), x, passing->differentiable);  // (numel)
    const auto part = [&](size_t i) {
      int64_t begin = 0;
      for (size_t j = 0; j < i; ++j) begin += carried[j];
      return flat.narrow(0, begin, carried[i]);
    };
    *carry = {.q = part(1).view({bsz, kernel - 1, -1}).to(x.scalar_type()),
              .k = part(2).view({bsz, kernel - 1, -1}).to(x.scalar_type()),
              .v = part(3).view({bsz, kernel - 1, -1}).to(x.scalar_type()),
              .state = part(0).view({bsz, value_heads, options.key_head_dim, options.value_head_dim})};
  }
  const auto convolved = [&](const at::Tensor& projected, const CausalConv1d& conv, at::Tensor* history,
                             int64_t head_dim) {
    const at::Tensor out = at::silu(conv.forward(projected, history ? *history : at::Tensor(), documents.conv));
    if (history) *history = last_inputs(*history, projected, kernel);
    return out.view({bsz, seq, -1, head_dim});  // (B, S, heads, hd)
  };
  const at::Tensor q = convolved(projected_q, *conv_q, carry ? &carry->q : nullptr, options.key_head_dim);
  const at::Tensor k = convolved(projected_k, *conv_k, carry ? &carry->k : nullptr, options.key_head_dim);
  const at::Tensor v = convolved(projected_v, *conv_v, carry ? &carry->v : nullptr, options.value_head_dim);
  at::Tensor initial_state = carry ? carry->state : at::Tensor();  // (B, Hv, dk, dv)
  if (initial_state.defined() && documents.continues.defined()) {
    // A row whose first token starts a document starts empty; its gradient to the received state is zero.
    initial_state = initial_state * documents.continues.view({bsz, 1, 1, 1}).to(initial_state.scalar_type());
  }
  const DeltaRuleInputs rule{.q = l2_normalize(q.to(at::kFloat)) / std::sqrt(static_cast<double>(options.key_head_dim)),
                             .k = l2_normalize(k.to(at::kFloat)),
                             .v = v,
                             .g = g,
                             .beta = beta,
                             .initial_state = initial_state,
                             .document_ids = documents.rule};
  DeltaRuleOutput r = carry && seq == 1 ? recurrent_gated_delta_rule(rule)
                                        : chunk_gated_delta_rule(rule, options.chunk_size);  // out (B, S, Hv, dv)
  if (carry) carry->state = std::move(r.state);
  at::Tensor out = r.out;  // (B, S, Hv, dv)
  if (passing) {
    // As soon as the recurrence is done: the next rank waits for it, not for the output projection.
    const at::Tensor flat = at::cat({carry->state.to(compute).flatten(), carry->q.to(compute).flatten(),
                                     carry->k.to(compute).flatten(), carry->v.to(compute).flatten()});  // (numel)
    out = detail::send_to_next(out, flat, *passing->sharding->group, passing->differentiable);
  }
  // Norm, then gate, in fp32 (HF's RMSNormGated).
  const at::Tensor gated = norm->forward(out).to(at::kFloat) * at::silu(z.to(at::kFloat));  // (B, S, Hv, dv)
  return wo->forward(gated.to(x.scalar_type()).reshape({bsz, seq, -1}));                    // (B, S, D)
}

at::Tensor GatedDeltaNet::context_parallel_mix(const at::Tensor& x, const AttentionContext& context) const {
  constexpr const char* kWhere = "titan::nn::GatedDeltaNet";
  const SequenceSharding& sharding = *context.sharding;
  const SequenceLayout& layout = sharding.layout;
  TITAN_CHECK_NOT_IMPLEMENTED(!layout.load_balance,
                              "[{}] expected contiguous context-parallel shards, got headtail load balancing: the "
                              "recurrence runs through the sequence in order, rank to rank. Set "
                              "parallelism.context_parallel_load_balancer None.",
                              kWhere);
  layout.check(kWhere);
  TITAN_CHECK_VALUE(x.size(1) == layout.local_len(),
                    "[{}] expected this rank's {} of the sequence's {} tokens, got {}. Shard the batch with the "
                    "context's layout.",
                    kWhere, layout.local_len(), layout.seq_len, x.size(1));
  const int64_t start = layout.rank * layout.local_len();
  const int64_t kernel = options.conv_kernel;
  Documents documents;
  if (context.document_ids.defined()) {
    TITAN_CHECK_VALUE(context.document_ids.dim() == 2 && context.document_ids.size(1) == layout.seq_len,
                      "[{}] expected the whole sequence's document ids (B, {}) under context parallelism, got {}.",
                      kWhere, layout.seq_len, c10::str(context.document_ids.sizes()));
    const at::Tensor runs = document_runs(context.document_ids).to(x.device());  // (B, S_whole)
    documents.rule = runs.narrow(1, start, x.size(1));
    // Before the sequence's first token, -1: no document of its own.
    documents.conv = at::constant_pad_nd(runs, {kernel - 1, 0}, -1).narrow(1, start, kernel - 1 + x.size(1));
    if (start > 0) documents.continues = runs.select(1, start).eq(runs.select(1, start - 1));
  }
  bool trains = x.requires_grad();
  for (const at::Tensor& p : parameters()) trains = trains || p.requires_grad();
  const Passing passing{.sharding = &sharding, .differentiable = c10::GradMode::is_enabled() && trains};
  Carry carry;
  return mix(x, documents, &carry, &passing);
}

at::Tensor GatedDeltaNet::forward(const at::Tensor& x, const RopeTables&, const AttentionContext& context) const {
  check_attention_context(context, "titan::nn::GatedDeltaNet");
  return parallel::module_call(*this, x, [&](const at::Tensor& in) {
    if (context.sharding) return context_parallel_mix(in, context);
    return mix(in, {.rule = context.document_ids, .conv = context.document_ids, .continues = {}}, nullptr, nullptr);
  });
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
    const at::Tensor out = mix(input, {}, &carry, nullptr);
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
