// SPDX-License-Identifier: BSD-3-Clause
#include "titan/optim/adamw.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <regex>

#include "titan/core/error.hpp"
#include "titan/optim/detail/adam_bf16_states.hpp"

namespace titan {

std::vector<ParamSettings> param_settings(size_t count, const std::vector<std::string>& names,
                                          const std::vector<ParamGroup>& groups, double weight_decay) {
  std::vector<ParamSettings> settings(count, {.weight_decay = weight_decay});
  if (groups.empty()) return settings;
  TITAN_CHECK_VALUE(names.size() == count,
                    "[titan::param_settings] expected a name for each of the {} parameters to place them in parameter "
                    "groups (optimizer.exclude_from_weight_decay), got {} names. Pass the parameters' FQNs "
                    "(RankModel::parameter_names, titan::parameter_names).",
                    count, names.size());
  std::vector<std::regex> patterns;
  for (const ParamGroup& g : groups) {
    TITAN_CHECK_VALUE(g.lr_scale >= 0 && g.weight_decay.value_or(0) >= 0,
                      "[titan::param_settings] expected parameter group '{}' with non-negative weight_decay and "
                      "lr_scale, got {} and {}.",
                      g.pattern, g.weight_decay.value_or(weight_decay), g.lr_scale);
    try {
      patterns.emplace_back(g.pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw ConfigError("optimizer.exclude_from_weight_decay",
                        fmt::format("[titan::param_settings] expected parameter group patterns "
                                    "(optimizer.exclude_from_weight_decay, or the ParamGroups passed to AdamW) to be "
                                    "ECMAScript regular expressions, got '{}' ({}). Escape special characters (\\. "
                                    "for a dot).",
                                    g.pattern, e.what()));
    }
  }
  for (size_t i = 0; i < count; ++i) {
    for (size_t g = 0; g < groups.size(); ++g) {
      if (!std::regex_search(names[i], patterns[g])) continue;
      settings[i] = {.weight_decay = groups[g].weight_decay.value_or(weight_decay), .lr_scale = groups[g].lr_scale};
      break;
    }
  }
  return settings;
}

std::vector<ParamGroup> param_groups(const OptimizerConfig& config) {
  std::vector<ParamGroup> groups;
  for (const std::string& pattern : config.exclude_from_weight_decay) {
    groups.push_back({.pattern = pattern, .weight_decay = 0.0});
  }
  return groups;
}

AdamW::AdamW(std::vector<at::Tensor> params, const OptimizerConfig& config, const std::vector<std::string>& names,
             const std::vector<ParamGroup>& groups)
    : params_(std::move(params)), config_(config) {
  TITAN_CHECK_VALUE(config_.lr >= 0 && config_.eps >= 0 && config_.weight_decay >= 0,
                    "[titan::AdamW] expected non-negative optimizer.lr, eps and weight_decay, got {}, {}, {}.",
                    config_.lr, config_.eps, config_.weight_decay);
  std::vector<ParamGroup> all = groups;
  for (ParamGroup& g : param_groups(config_)) all.push_back(std::move(g));
  settings_ = param_settings(params_.size(), names, all, config_.weight_decay);
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
    case OptimizerImplementation::foreach:
      // The multi-tensor kernels take one lr and one weight decay: one call per distinct pair, in first-use order.
      for (std::vector<size_t> batch : same_settings(active)) {
        const ParamSettings& s = settings_[batch.front()];
        if (config_.implementation == OptimizerImplementation::fused) {
          step_fused(lr * s.lr_scale, s.weight_decay, batch);
        } else {
          step_foreach(lr * s.lr_scale, s.weight_decay, batch);
        }
      }
      break;
    case OptimizerImplementation::fused_opt_states_bf16:
      step_bf16_states(lr, active);
      break;
    case OptimizerImplementation::for_loop:
      step_for_loop(lr, active);
      break;
  }
}

std::vector<std::vector<size_t>> AdamW::same_settings(const std::vector<size_t>& active) const {
  std::vector<std::vector<size_t>> batches;
  for (size_t i : active) {
    const ParamSettings& s = settings_[i];
    auto it = std::find_if(batches.begin(), batches.end(), [&](const std::vector<size_t>& b) {
      const ParamSettings& o = settings_[b.front()];
      return o.weight_decay == s.weight_decay && o.lr_scale == s.lr_scale;
    });
    if (it == batches.end()) {
      batches.push_back({i});
    } else {
      it->push_back(i);
    }
  }
  return batches;
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

void AdamW::step_fused(double lr, double weight_decay, const std::vector<size_t>& active) {
  auto t = gather(active, params_, exp_avgs_, exp_avg_sqs_, steps_);
  const auto& c = config_;
  if (c.name == OptimizerName::adamw) {
    at::_fused_adamw_(t.params, t.grads, t.exp_avgs, t.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, t.steps, lr, c.beta1,
                      c.beta2, weight_decay, c.eps, /*amsgrad=*/false, /*maximize=*/false);
  } else {
    at::_fused_adam_(t.params, t.grads, t.exp_avgs, t.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, t.steps, lr, c.beta1,
                     c.beta2, weight_decay, c.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
}

void AdamW::step_foreach(double lr, double weight_decay, const std::vector<size_t>& active) {
  auto t = gather(active, params_, exp_avgs_, exp_avg_sqs_, steps_);
  const auto& c = config_;
  if (c.name == OptimizerName::adamw) {
    at::_foreach_mul_(t.params, 1.0 - lr * weight_decay);
  } else if (weight_decay != 0) {
    t.grads = at::_foreach_add(t.grads, t.params, weight_decay);  // Adam: L2 decay, new tensors
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
    const double lr_i = lr * settings_[i].lr_scale;
    const double weight_decay = settings_[i].weight_decay;
    if (c.name == OptimizerName::adamw) {
      p.mul_(1.0 - lr_i * weight_decay);
    } else if (weight_decay != 0) {
      g = g.add(p, weight_decay);
    }
    exp_avgs_[i].lerp_(g, 1.0 - c.beta1);
    exp_avg_sqs_[i].mul_(c.beta2).addcmul_(g, g, 1.0 - c.beta2);
    const double bc1 = 1.0 - std::pow(c.beta1, t);
    const double bc2 = 1.0 - std::pow(c.beta2, t);
    const at::Tensor denom = (exp_avg_sqs_[i].sqrt() / std::sqrt(bc2)).add_(c.eps);
    p.addcdiv_(exp_avgs_[i], denom, -lr_i / bc1);
  }
}

void AdamW::step_bf16_states(double lr, const std::vector<size_t>& active) {
  const auto& c = config_;
  for (size_t i : active) {
    steps_[i].add_(1);
    detail::adam_step_bf16_states(
        {.param = params_[i], .grad = params_[i].grad(), .exp_avg = exp_avgs_[i], .exp_avg_sq = exp_avg_sqs_[i]},
        {.decoupled = c.name == OptimizerName::adamw,
         .lr = lr * settings_[i].lr_scale,
         .beta1 = c.beta1,
         .beta2 = c.beta2,
         .eps = c.eps,
         .weight_decay = settings_[i].weight_decay,
         .step = steps_[i].item<double>()});
  }
}

}  // namespace titan
