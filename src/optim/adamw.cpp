// SPDX-License-Identifier: BSD-3-Clause
#include "titan/optim/adamw.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "titan/core/error.hpp"
#include "titan/optim/detail/adam_bf16_states.hpp"

namespace titan {

AdamW::AdamW(std::vector<at::Tensor> params, const OptimizerConfig& config)
    : params_(std::move(params)), config_(config) {
  TITAN_CHECK_VALUE(config_.lr >= 0 && config_.eps >= 0 && config_.weight_decay >= 0,
                    "[titan::AdamW] expected non-negative optimizer.lr, eps and weight_decay, got {}, {}, {}.",
                    config_.lr, config_.eps, config_.weight_decay);
  const bool bf16_states = config_.implementation == OptimizerImplementation::fused_opt_states_bf16;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    TITAN_CHECK_VALUE(!bf16_states || p.scalar_type() == at::kFloat,
                      "[titan::AdamW] expected float32 parameters with optimizer.implementation "
                      "fused_opt_states_bf16 (fp32 master weights, bf16 exp_avg and exp_avg_sq), got {} for "
                      "parameter {}. Set training.dtype = \"float32\", or keep bf16 parameters with "
                      "optimizer.implementation \"fused\" (their moments are bf16 already).",
                      c10::toString(p.scalar_type()), i);
    // Like the parameter (shape, strides, device); in bf16 under fused_opt_states_bf16.
    const auto moment = [&] {
      return bf16_states ? at::zeros_like(p, p.options().dtype(at::kBFloat16), at::MemoryFormat::Preserve)
                         : at::zeros_like(p, at::MemoryFormat::Preserve);
    };
    exp_avgs_.push_back(moment());
    exp_avg_sqs_.push_back(moment());
    steps_.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
  }
}

std::vector<ParamState> AdamW::state(size_t i) const {
  return {{.name = "exp_avg", .tensor = exp_avgs_.at(i), .like_param = true},
          {.name = "exp_avg_sq", .tensor = exp_avg_sqs_.at(i), .like_param = true},
          {.name = "step", .tensor = steps_.at(i), .like_param = false}};
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  std::vector<size_t> active;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].grad().defined()) active.push_back(i);
  }
  if (active.empty()) return;
  switch (config_.implementation) {
    case OptimizerImplementation::fused:
      step_fused(lr, active);
      break;
    case OptimizerImplementation::fused_opt_states_bf16:
      step_bf16_states(lr, active);
      break;
    case OptimizerImplementation::foreach:
      step_foreach(lr, active);
      break;
    case OptimizerImplementation::for_loop:
      step_for_loop(lr, active);
      break;
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
  const auto& c = config_;
  if (c.name == OptimizerName::adamw) {
    at::_fused_adamw_(t.params, t.grads, t.exp_avgs, t.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, t.steps, lr, c.beta1,
                      c.beta2, c.weight_decay, c.eps, /*amsgrad=*/false, /*maximize=*/false);
  } else {
    at::_fused_adam_(t.params, t.grads, t.exp_avgs, t.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, t.steps, lr, c.beta1,
                     c.beta2, c.weight_decay, c.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
}

void AdamW::step_foreach(double lr, const std::vector<size_t>& active) {
  auto t = gather(active, params_, exp_avgs_, exp_avg_sqs_, steps_);
  const auto& c = config_;
  if (c.name == OptimizerName::adamw) {
    at::_foreach_mul_(t.params, 1.0 - lr * c.weight_decay);
  } else if (c.weight_decay != 0) {
    t.grads = at::_foreach_add(t.grads, t.params, c.weight_decay);  // Adam: L2 decay, new tensors
  }
  at::_foreach_lerp_(t.exp_avgs, t.grads, 1.0 - c.beta1);
  at::_foreach_mul_(t.exp_avg_sqs, c.beta2);
  at::_foreach_addcmul_(t.exp_avg_sqs, t.grads, t.grads, 1.0 - c.beta2);
  // All tensors of one optimizer share the step count, so the bias corrections are scalars.
  const double step = t.steps.front().item<double>();
  const double bc1 = 1.0 - std::pow(c.beta1, step);
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(c.beta2, step));
  auto denom = at::_foreach_sqrt(t.exp_avg_sqs);
  at::_foreach_div_(denom, bc2_sqrt);
  at::_foreach_add_(denom, c.eps);
  at::_foreach_addcdiv_(t.params, t.exp_avgs, denom, -lr / bc1);
}

void AdamW::step_for_loop(double lr, const std::vector<size_t>& active) {
  const auto& c = config_;
  for (size_t i : active) {
    at::Tensor& p = params_[i];
    at::Tensor g = p.grad();
    steps_[i].add_(1);
    const double t = steps_[i].item<double>();
    if (c.name == OptimizerName::adamw) {
      p.mul_(1.0 - lr * c.weight_decay);
    } else if (c.weight_decay != 0) {
      g = g.add(p, c.weight_decay);
    }
    exp_avgs_[i].lerp_(g, 1.0 - c.beta1);
    exp_avg_sqs_[i].mul_(c.beta2).addcmul_(g, g, 1.0 - c.beta2);
    const double bc1 = 1.0 - std::pow(c.beta1, t);
    const double bc2 = 1.0 - std::pow(c.beta2, t);
    const at::Tensor denom = (exp_avg_sqs_[i].sqrt() / std::sqrt(bc2)).add_(c.eps);
    p.addcdiv_(exp_avgs_[i], denom, -lr / bc1);
  }
}

void AdamW::step_bf16_states(double lr, const std::vector<size_t>& active) {
  const auto& c = config_;
  for (size_t i : active) {
    steps_[i].add_(1);
    detail::adam_step_bf16_states(
        {.param = params_[i], .grad = params_[i].grad(), .exp_avg = exp_avgs_[i], .exp_avg_sq = exp_avg_sqs_[i]},
        {.decoupled = c.name == OptimizerName::adamw,
         .lr = lr,
         .beta1 = c.beta1,
         .beta2 = c.beta2,
         .eps = c.eps,
         .weight_decay = c.weight_decay,
         .step = steps_[i].item<double>()});
  }
}

}  // namespace titan
