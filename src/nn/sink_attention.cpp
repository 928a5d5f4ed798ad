// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/sink_attention.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <cmath>
#include <limits>
#include <utility>

#include "attention_blocks.hpp"
#include "titan/core/error.hpp"
#include "titan/nn/sequence_attention.hpp"

namespace titan::nn {
namespace {

using detail::BlockMask;
using torch::autograd::variable_list;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The keys each query may see as an additive mask, or the kernel's own causal flag when nothing narrows it.
BlockMask keys_seen(const at::Tensor& q, int64_t window, const at::Tensor& document_ids) {
  const int64_t S = q.size(2);
  if ((window <= 0 || window >= S) && !document_ids.defined()) return {.causal = true};
  const at::Tensor i = at::arange(S, q.options().dtype(at::kLong)).unsqueeze(1);  // (S, 1): query index
  const at::Tensor j = i.t();                                                     // (1, S): key index
  at::Tensor allowed = j.le(i);                                                   // (S, S)
  if (window > 0) allowed = allowed.logical_and(i - j < window);
  allowed = allowed.unsqueeze(0);  // (1, S, S)
  if (document_ids.defined()) {
    TITAN_CHECK_VALUE(document_ids.dim() == 2 && document_ids.size(0) == q.size(0) && document_ids.size(1) == S,
                      "[titan::nn::sink_attention] expected document ids (B={}, S={}), got {}.", q.size(0), S,
                      c10::str(document_ids.sizes()));
    const at::Tensor docs = document_ids.to(q.device());                    // (B, S)
    allowed = allowed.logical_and(docs.unsqueeze(2) == docs.unsqueeze(1));  // (B, S, S)
  }
  const at::Tensor additive = at::zeros(allowed.sizes(), q.options()).masked_fill(allowed.logical_not(), kNegInf);
  return {.causal = false, .additive = additive.unsqueeze(1)};  // (B or 1, 1, S, S); every row sees itself
}

// sinks (H) as (1, H, 1) fp32 logits; -inf (a sink that takes nothing) when undefined.
at::Tensor sink_logits(const at::Tensor& sinks, const at::Tensor& q) {
  if (!sinks.defined()) return at::full({1, q.size(1), 1}, kNegInf, q.options().dtype(at::kFloat));
  return sinks.to(at::kFloat).view({1, -1, 1});
}

struct SinkForward {
  at::Tensor out;  // (B, H, S, HD) in q's dtype, laid out as the kernel's output
  at::Tensor lse;  // (B, H, S) float32, the sink included
};

SinkForward forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& sinks,
                         const BlockMask& mask, double scale) {
  const detail::BlockResult block = detail::attend_block(q, k, v, mask, scale);
  const at::Tensor lse = at::logaddexp(block.lse, sink_logits(sinks, q));             // (B, H, S)
  const at::Tensor keep = at::exp(block.lse - lse).unsqueeze(-1);                     // (B, H, S, 1)
  at::Tensor out = at::empty_like(block.out).copy_(block.out.to(at::kFloat) * keep);  // (B, H, S, HD)
  return {out, lse};
}

struct SinkAttentionBackward : torch::autograd::Node {
  SinkAttentionBackward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor sinks, SinkForward fwd, BlockMask mask,
                        double scale)
      : q_(std::move(q)),
        k_(std::move(k)),
        v_(std::move(v)),
        sinks_(std::move(sinks)),
        fwd_(std::move(fwd)),
        mask_(std::move(mask)),
        scale_(scale) {}

  variable_list apply(variable_list&& grads) override {
    at::NoGradGuard no_grad;
    TITAN_CHECK(grads[0].defined(), "[titan::nn::sink_attention] expected an output gradient, got none.");
    const at::Tensor& grad = grads[0];  // (B, H, S, HD)
    auto [dq, dk, dv] = detail::attend_block_backward(grad, q_, k_, v_, fwd_.out, fwd_.lse, mask_, scale_);
    at::Tensor dsinks;  // (H)
    if (sinks_.defined()) {
      // d sink = sum over rows of p_sink * (0 - D), D = dO . O' (the row's softmax-weighted value gradient).
      const at::Tensor rows = (grad.to(at::kFloat) * fwd_.out.to(at::kFloat)).sum(-1);  // (B, H, S)
      const at::Tensor p_sink = at::exp(sink_logits(sinks_, q_) - fwd_.lse);            // (B, H, S)
      dsinks = (p_sink * rows).sum(at::IntArrayRef{0, 2}).neg().to(sinks_.scalar_type());
    }
    return {dq, dk, dv, dsinks};
  }
  std::string name() const override { return "titan::SinkAttentionBackward"; }
  void release_variables() override {
    q_.reset();
    k_.reset();
    v_.reset();
    sinks_.reset();
    fwd_ = {};
    mask_ = {};
  }

 private:
  at::Tensor q_, k_, v_, sinks_;  // detached inputs
  SinkForward fwd_;               // output and log-sum-exp with the sink
  BlockMask mask_;
  double scale_;
};

void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& sinks) {
  TITAN_CHECK_VALUE(
      q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() && q.size(1) % k.size(1) == 0,
      "[titan::nn::sink_attention] expected q (B, H, S, HD), k and v (B, KVH, S', HD) with H a multiple "
      "of KVH, got q {}, k {}, v {}.",
      c10::str(q.sizes()), c10::str(k.sizes()), c10::str(v.sizes()));
  TITAN_CHECK_VALUE(!sinks.defined() || (sinks.dim() == 1 && sinks.size(0) == q.size(1)),
                    "[titan::nn::sink_attention] expected one sink per query head ({}), got {}.", q.size(1),
                    c10::str(sinks.sizes()));
}

}  // namespace

at::Tensor sink_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& sinks,
                          int64_t window, const AttentionContext& context) {
  if (context.sharding && context.sharding->rotate == CpRotateMethod::ulysses) {
    // Whole sequences of a subset of the heads: the window and the masks as on one device, each head its sink.
    return ulysses_attention(q, k, v, *context.sharding, context.document_ids,
                             [&](const at::Tensor& qh, const at::Tensor& kh, const at::Tensor& vh, int64_t head_begin,
                                 const AttentionContext& whole) {
                               const at::Tensor s = sinks.defined() ? sinks.narrow(0, head_begin, qh.size(1)) : sinks;
                               return sink_attention(qh, kh, vh, s, window, whole);
                             });
  }
  TITAN_CHECK_NOT_IMPLEMENTED(!context.sharding,
                              "[titan::nn::sink_attention] expected whole sequences, got one split over {} "
                              "context-parallel ranks: sinks and sliding windows are built into the Ulysses "
                              "context-parallel attention only. Set parallelism.context_parallel_rotate_method "
                              "ulysses, or parallelism.context_parallel_degree 1.",
                              context.sharding ? context.sharding->layout.degree : 1);
  check_shapes(q, k, v, sinks);
  TITAN_CHECK_VALUE(window >= 0, "[titan::nn::sink_attention] expected a window >= 0 (0: none), got {}.", window);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  BlockMask mask = keys_seen(q, window, context.document_ids);
  SinkForward fwd;
  {
    at::NoGradGuard no_grad;
    fwd = forward_impl(q, k, v, sinks, mask, scale);
  }
  at::Tensor out = fwd.out;
  const bool sinks_learn = sinks.defined() && sinks.requires_grad();
  if (c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad() || sinks_learn)) {
    auto node = std::shared_ptr<SinkAttentionBackward>(
        new SinkAttentionBackward(q.detach(), k.detach(), v.detach(), sinks.defined() ? sinks.detach() : at::Tensor(),
                                  {fwd.out.detach(), fwd.lse}, std::move(mask), scale),
        torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(q, k, v, sinks));
    torch::autograd::set_history(out, node);
  }
  return out;
}

at::Tensor cached_sink_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                 const at::Tensor& sinks, int64_t window) {
  check_shapes(q, k, v, sinks);
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2), T = k.size(2);
  at::Tensor allowed = mask.to(at::kBool);  // (B or 1, 1, S, T)
  if (window > 0) {
    // Query s sits in column T - S + s; a sequence's tokens are contiguous columns after its left padding.
    const at::Tensor cols_q = at::arange(T - S, T, q.options().dtype(at::kLong)).unsqueeze(1);  // (S, 1)
    const at::Tensor cols_k = at::arange(T, q.options().dtype(at::kLong)).unsqueeze(0);         // (1, T)
    allowed = allowed.logical_and(cols_q - cols_k < window);
  }
  const int64_t groups = H / k.size(1);
  const at::Tensor keys = k.repeat_interleave(groups, 1).to(at::kFloat);    // (B, H, T, HD)
  const at::Tensor values = v.repeat_interleave(groups, 1).to(at::kFloat);  // (B, H, T, HD)
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const at::Tensor scores =
      (at::matmul(q.to(at::kFloat), keys.transpose(-2, -1)) * scale).masked_fill(allowed.logical_not(), kNegInf);
  const at::Tensor sink = sink_logits(sinks, q).unsqueeze(-1).expand({B, H, S, 1});  // (B, H, S, 1)
  // A padding row that sees no key puts all its weight on the sink (or on nothing): zeros, not NaN.
  const at::Tensor probs = at::softmax(at::cat({scores, sink}, -1), -1).narrow(-1, 0, T);  // (B, H, S, T)
  return at::matmul(at::nan_to_num(probs, 0.0), values).to(q.scalar_type());               // (B, H, S, HD)
}

}  // namespace titan::nn
