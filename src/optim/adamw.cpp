// SPDX-License-Identifier: BSD-3-Clause
#include "titan/optim/adamw.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "titan/core/error.hpp"

namespace titan {

AdamW::AdamW(std::vector<at::Tensor> params, AdamWConfig config) : params_(std::move(params)), config_(std::move(config)) {
  const auto& impl = config_.implementation;
  TITAN_CHECK_VALUE(impl == "fused" || impl == "foreach" || impl == "for-loop",
                    "[titan::AdamW] expected optimizer.implementation in fused|foreach|for-loop, got '{}'.", impl);
  TITAN_CHECK_VALUE(config_.lr >= 0 && config_.eps >= 0 && config_.weight_decay >= 0,
                    "[titan::AdamW] expected non-negative lr, eps and weight_decay, got {}, {}, {}.",
                    config_.lr, config_.eps, config_.weight_decay);
  for (const auto& p : params_) {
    exp_avgs_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
    exp_avg_sqs_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
    steps_.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
  }
}

void AdamW::zero_grad() {
  for (auto& p : params_) p.mutable_grad().reset();
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  std::vector<size_t> active;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].grad().defined()) active.push_back(i);
  }
  if (active.empty()) return;
  if (config_.implementation == "fused") {
    step_fused(lr, active);
  } else if (config_.implementation == "foreach") {
    step_foreach(lr, active);
  } else {
    step_for_loop(lr, active);
  }
}

namespace {

// The tensors of the parameters that have a gradient this step, as the multi-tensor kernels take them.
struct ActiveLists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
};

ActiveLists gather(const std::vector<size_t>& active, const std::vector<at::Tensor>& params,
                   const std::vector<at::Tensor>& m, const std::vector<at::Tensor>& v,
                   const std::vector<at::Tensor>& steps) {
  ActiveLists out;
  for (size_t i : active) {
    out.params.push_back(params[i]);
    out.grads.push_back(params[i].grad());
    out.exp_avgs.push_back(m[i]);
    out.exp_avg_sqs.push_back(v[i]);
    out.steps.push_back(steps[i]);
  }
  // The fused kernel reads step counters the caller has already advanced (as torch.optim does).
  at::_foreach_add_(out.steps, 1);
  return out;
}
}  // namespace

void AdamW::step_fused(double lr, const std::vector<size_t>& active) {
  auto t = gather(active, params_, exp_avgs_, exp_avg_sqs_, steps_);
  at::_fused_adamw_(t.params, t.grads, t.exp_avgs, t.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, t.steps, lr,
                    config_.beta1, config_.beta2, config_.weight_decay, config_.eps, /*amsgrad=*/false,
                    /*maximize=*/false);
}

void AdamW::step_foreach(double lr, const std::vector<size_t>& active) {
  auto t = gather(active, params_, exp_avgs_, exp_avg_sqs_, steps_);
  at::_foreach_mul_(t.params, 1.0 - lr * config_.weight_decay);
  at::_foreach_lerp_(t.exp_avgs, t.grads, 1.0 - config_.beta1);
  at::_foreach_mul_(t.exp_avg_sqs, config_.beta2);
  at::_foreach_addcmul_(t.exp_avg_sqs, t.grads, t.grads, 1.0 - config_.beta2);
  // All tensors of one optimizer share the step count, so the bias corrections are scalars.
  const double step = t.steps.front().item<double>();
  const double bc1 = 1.0 - std::pow(config_.beta1, step);
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(config_.beta2, step));
  auto denom = at::_foreach_sqrt(t.exp_avg_sqs);
  at::_foreach_div_(denom, bc2_sqrt);
  at::_foreach_add_(denom, config_.eps);
  at::_foreach_addcdiv_(t.params, t.exp_avgs, denom, -lr / bc1);
}

void AdamW::step_for_loop(double lr, const std::vector<size_t>& active) {
  for (size_t i : active) {
    at::Tensor& p = params_[i];
    const at::Tensor& g = p.grad();
    steps_[i].add_(1);
    const double t = steps_[i].item<double>();
    p.mul_(1.0 - lr * config_.weight_decay);
    exp_avgs_[i].lerp_(g, 1.0 - config_.beta1);
    exp_avg_sqs_[i].mul_(config_.beta2).addcmul_(g, g, 1.0 - config_.beta2);
    const double bc1 = 1.0 - std::pow(config_.beta1, t);
    const double bc2 = 1.0 - std::pow(config_.beta2, t);
    const at::Tensor denom = (exp_avg_sqs_[i].sqrt() / std::sqrt(bc2)).add_(config_.eps);
    p.addcdiv_(exp_avgs_[i], denom, -lr / bc1);
  }
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    bytes += exp_avgs_[i].nbytes() + exp_avg_sqs_[i].nbytes() + steps_[i].nbytes();
  }
  return bytes;
}

}  // namespace titan
