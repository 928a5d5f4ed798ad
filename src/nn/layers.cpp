// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/layers.hpp"

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/autocast_mode.h>

#include <utility>

#include "titan/layout/module_hooks.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/saved_ops.hpp"
#include "titan/nn/split_backward.hpp"

namespace titan::nn {

Linear::Linear(int64_t in_features, int64_t out_features, const at::TensorOptions& options, bool bias_) {
  weight = register_parameter("weight", at::empty({out_features, in_features}, options));
  if (bias_) bias = register_parameter("bias", at::empty({out_features}, options));
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  return parallel::module_call(*this, x, [&](const at::Tensor& in) {
    at::Tensor y = parallel::with_param(  // (..., out)
        weight, [&](const at::Tensor& w, const parallel::GatheredFloat8* float8) {
          return matmul ? matmul(in, w, {.float8 = float8, .tp_group = tp_group}) : nn::linear(in, w, this);
        });
    if (lora) {
      // Inside the style's call: under TP this is the same kind of part as y (adapters placed as the weight).
      const at::Tensor dropped = lora->dropout > 0 ? at::dropout(in, lora->dropout, is_training()) : in;
      y = y + lora->b->forward(lora->a->forward(dropped)) * lora->scale;  // (..., out), PEFT's order of ops
    }
    return bias_after_reduction ? y : add_bias(y);
  });
}

parallel::ShardableLayer::Adapter Linear::shardable_adapter() {
  if (!lora) return {};
  return {.a = &lora->a->weight, .b = &lora->b->weight};
}

at::Tensor Linear::add_bias(const at::Tensor& y) const {
  if (!bias.defined()) return y;
  // Added after the (kept, converted or widened) matmul, in its output dtype as autocast's linear would.
  return parallel::with_param(bias, [&](const at::Tensor& b) { return y + b.to(y.scalar_type()); });
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({num_embeddings, dim}, options));
}

at::Tensor Embedding::forward(const at::Tensor& tokens) const {
  return parallel::module_call(*this, tokens, [&](const at::Tensor& in) {
    return parallel::with_param(weight, [&](const at::Tensor& w) { return at::embedding(w, in); });
  });
}

TiedLinear::TiedLinear(std::shared_ptr<Embedding> embedding) : embedding_(std::move(embedding)) {}

at::Tensor TiedLinear::forward(const at::Tensor& x) const {
  return parallel::module_call(*this, x, [&](const at::Tensor& in) {
    return parallel::with_param(embedding_->weight, [&](const at::Tensor& w) { return nn::linear(in, w, this); });
  });
}

namespace {

// at::rms_norm as ATen composes it on CPU (upcast, x * rsqrt(mean(x^2) + eps), times the weight, cast
// back), with the weight's product made deferrable: the same ops, so the same bits and the same backward.
// Elsewhere (a fused kernel) and under autocast (which casts inside at::rms_norm) it is at::rms_norm.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {  // (..., D) -> (..., D)
  const bool split = recording_weight_grads() != nullptr && w.requires_grad() && x.device().is_cpu() &&
                     !at::autocast::is_autocast_enabled(at::kCPU) && w.scalar_type() == x.scalar_type() &&
                     at::toOpMathType(x.scalar_type()) == at::kFloat;
  if (!split) return at::rms_norm(x, {x.size(-1)}, w, eps);
  const at::Tensor up = x.to(at::kFloat);  // (..., D)
  const at::Tensor rstd =
      at::rsqrt(at::pow(up, 2).mean({x.dim() - 1}, true).add_(static_cast<float>(eps)));  // (..., 1)
  const at::Tensor y = defer_weight_grad(up.mul(rstd).mul(w), 1);                         // (..., D) fp32
  return y.contiguous().type_as(x);
}

}  // namespace

RMSNorm::RMSNorm(int64_t dim, double eps_, const at::TensorOptions& options, bool unit_offset_)
    : eps(eps_), unit_offset(unit_offset_) {
  weight = register_parameter("weight", at::empty({dim}, options));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  // at::rms_norm accumulates in fp32 for bf16 input (torchtitan's nn.RMSNorm numerics), with the
  // weight applied in the same op.
  return parallel::module_call(*this, x, [&](const at::Tensor& in) {
    return parallel::with_param(weight, [&](const at::Tensor& w) {
      if (!unit_offset) return nn::rms_norm(in, w, eps);
      // 1 + w in fp32 (HF's Qwen3.5 numerics): in bf16 the sum would round away most of w.
      return nn::rms_norm(in.to(at::kFloat), w.to(at::kFloat) + 1.0, eps).to(in.scalar_type());
    });
  });
}

void RMSNorm::reset_parameters() {
  if (unit_offset) {
    zeros_(weight);
  } else {
    ones_(weight);
  }
}

LayerNorm::LayerNorm(int64_t dim, double eps_, const at::TensorOptions& options, bool bias_) : eps(eps_) {
  weight = register_parameter("weight", at::empty({dim}, options));
  if (bias_) bias = register_parameter("bias", at::empty({dim}, options));
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const {
  return parallel::module_call(*this, x, [&](const at::Tensor& in) {
    return parallel::with_param(weight, [&](const at::Tensor& w) {
      if (!bias.defined()) return at::layer_norm(in, {in.size(-1)}, w, {}, eps);
      return parallel::with_param(bias,
                                  [&](const at::Tensor& b) { return at::layer_norm(in, {in.size(-1)}, w, b, eps); });
    });
  });
}

void LayerNorm::reset_parameters() {
  ones_(weight);
  if (bias.defined()) zeros_(bias);
}

}  // namespace titan::nn
