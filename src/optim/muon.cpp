// SPDX-License-Identifier: BSD-3-Clause
#include "titan/optim/muon.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <regex>

#include "titan/core/config_loader.hpp"
#include "titan/core/error.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/optim/detail/muon_exchange.hpp"

namespace titan {

NewtonSchulz NewtonSchulz::of(const OptimizerConfig& config) {
  const std::vector<double>& k = config.muon_ns_coefficients;
  TITAN_CHECK_VALUE(k.size() == 3,
                    "[titan::NewtonSchulz] expected optimizer.muon_ns_coefficients to hold (a, b, c), got {}.",
                    fmt::join(k, ", "));
  return {.a = k[0], .b = k[1], .c = k[2], .steps = config.muon_ns_steps, .eps = config.muon_eps};
}

at::Tensor newton_schulz(const at::Tensor& g, const NewtonSchulz& ns) {
  TITAN_CHECK_VALUE(g.dim() == 2, "[titan::newton_schulz] expected a 2-D matrix, got shape ({}).",
                    fmt::join(g.sizes(), ", "));
  // torch.optim.Muon's ops in its order, so the result is its bits. A copy even of a bf16 g: torch's g.bfloat16()
  // would alias it and the division below would then change the caller's tensor.
  at::Tensor x = g.to(at::kBFloat16, /*non_blocking=*/false, /*copy=*/true);
  const bool tall = g.size(0) > g.size(1);
  if (tall) x = x.t();
  x.div_(at::clamp(at::linalg_vector_norm(x, 2), c10::optional<c10::Scalar>(ns.eps)));
  for (int64_t i = 0; i < ns.steps; ++i) {
    const at::Tensor gram = at::matmul(x, x.t());
    const at::Tensor gram_update = at::addmm(gram, gram, gram, ns.b, ns.c);
    x = at::addmm(x, gram_update, x, ns.a);
  }
  return tall ? x.t() : x;
}

double muon_lr_ratio(MuonAdjustLr fn, int64_t rows, int64_t cols) {
  const auto a = static_cast<double>(rows), b = static_cast<double>(cols);
  if (fn == MuonAdjustLr::match_rms_adamw) return 0.2 * std::sqrt(std::max(a, b));
  return std::sqrt(std::max(1.0, a / b));
}

std::vector<bool> muon_matrices(const std::vector<at::Tensor>& params, const std::vector<std::string>& names,
                                const OptimizerConfig& config, const std::vector<std::string>& adamw_modules) {
  const bool by_name = !adamw_modules.empty() || !config.muon_exclude.empty();
  TITAN_CHECK_VALUE(!by_name || names.size() == params.size(),
                    "[titan::muon_matrices] expected a name for each of the {} parameters (the embedding and head "
                    "modules and optimizer.muon_exclude are matched by name), got {} names. Pass the parameters' "
                    "FQNs (RankModel::parameter_names).",
                    params.size(), names.size());
  std::vector<std::regex> excluded;
  for (const std::string& pattern : config.muon_exclude) {
    try {
      excluded.emplace_back(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw ConfigError("optimizer.muon_exclude",
                        fmt::format("[titan::muon_matrices] expected optimizer.muon_exclude to hold ECMAScript "
                                    "regular expressions, got '{}' ({}). Escape special characters (\\\\. for a dot).",
                                    pattern, e.what()));
    }
  }
  std::vector<bool> routing(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    bool matrix = params[i].dim() == 2;
    for (const std::string& module : adamw_modules) matrix = matrix && !names[i].starts_with(module + ".");
    for (const std::regex& pattern : excluded) matrix = matrix && !std::regex_search(names[i], pattern);
    routing[i] = matrix;
  }
  return routing;
}

Muon::Muon(std::vector<at::Tensor> params, const OptimizerConfig& config, const std::vector<std::string>& names,
           MuonOptions options)
    : params_(std::move(params)), config_(config) {
  config_.name = OptimizerName::muon;  // whatever the caller's says: the checks of a Muon config
  validate(config_);
  std::vector<bool> routing = options.routing.empty() ? muon_matrices(params_, names, config_, options.adamw_modules)
                                                      : std::move(options.routing);
  TITAN_CHECK_VALUE(routing.size() == params_.size(),
                    "[titan::Muon] expected a routing flag (MuonOptions::routing) for each of the {} parameters, "
                    "got {}.",
                    params_.size(), routing.size());
  const bool named = names.size() == params_.size();
  const auto name_of = [&](size_t i) { return named ? names[i] : fmt::format("parameter {}", i); };
  std::vector<at::Tensor> adam_params, local_matrices;
  std::vector<std::string> adam_names, matrix_names;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    matrix_of_.push_back(routing[i] ? static_cast<int64_t>(matrices_.size()) : -1);
    adamw_of_.push_back(routing[i] ? -1 : static_cast<int64_t>(adam_params.size()));
    if (!routing[i]) {
      adam_params.push_back(p);
      if (named) adam_names.push_back(names[i]);
      continue;
    }
    const parallel::ShardedParam* sp = parallel::sharded_param(p);
    const std::vector<int64_t> shape = sp != nullptr ? sp->global_shape : p.sizes().vec();
    TITAN_CHECK_VALUE(shape.size() == 2,
                      "[titan::Muon] expected a 2-D matrix for each parameter routed to Muon, got {} of shape ({}). "
                      "Step it with AdamW: leave it out of MuonOptions::routing (muon_matrices leaves out every "
                      "parameter that is not 2-D) or match it with optimizer.muon_exclude.",
                      name_of(i), fmt::join(shape, ", "));
    matrices_.push_back(i);
    local_matrices.push_back(p);
    matrix_names.push_back(name_of(i));
    momentum_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
    lr_ratios_.push_back(muon_lr_ratio(config_.muon_adjust_lr_fn, shape[0], shape[1]));
  }
  std::vector<ParamGroup> groups = options.groups;
  for (ParamGroup& g : param_groups(config_)) groups.push_back(std::move(g));
  settings_ = param_settings(matrices_.size(), named ? matrix_names : std::vector<std::string>{}, groups,
                             config_.muon_weight_decay);
  OptimizerConfig adam = config_;
  adam.name = OptimizerName::adamw;
  adamw_ = std::make_unique<AdamW>(std::move(adam_params), adam, adam_names, options.groups);
  exchange_ = std::make_unique<detail::MuonExchange>(local_matrices, matrix_names, options.mesh);
}

Muon::~Muon() = default;

std::vector<ParamState> Muon::state(size_t i) const {
  if (matrix_of_.at(i) >= 0) {
    return {{.name = "momentum_buffer", .tensor = momentum_[static_cast<size_t>(matrix_of_[i])], .like_param = true}};
  }
  return adamw_->state(static_cast<size_t>(adamw_of_[i]));
}

int64_t Muon::orthogonalised_here() const {
  int64_t n = 0;
  for (size_t k = 0; k < matrices_.size(); ++k) n += exchange_->owns(k) ? 1 : 0;
  return n;
}

void Muon::step(double lr) {
  at::NoGradGuard no_grad;
  // Momentum and the update on the shards (element-wise, as on the whole), in bf16 as Newton-Schulz reads it.
  std::vector<size_t> active;
  std::vector<at::Tensor> updates;
  for (size_t k = 0; k < matrices_.size(); ++k) {
    const at::Tensor& g = params_[matrices_[k]].grad();
    if (!g.defined()) continue;
    at::Tensor& buf = momentum_[k];
    buf.lerp_(g, 1.0 - config_.muon_momentum);
    const at::Tensor update = config_.muon_nesterov ? g.lerp(buf, config_.muon_momentum) : buf;
    updates.push_back(update.to(at::kBFloat16, /*non_blocking=*/false, /*copy=*/true));
    active.push_back(k);
  }
  const NewtonSchulz ns = NewtonSchulz::of(config_);
  const std::vector<at::Tensor> orthogonal = exchange_->run(
      active, std::move(updates), [&](const at::Tensor& whole) { return newton_schulz(whole, ns); },
      [&] { adamw_->step(lr); });
  const double matrix_lr = lr * (config_.muon_lr / config_.lr);
  for (size_t a = 0; a < active.size(); ++a) {
    const size_t k = active[a];
    at::Tensor& p = params_[matrices_[k]];
    const double lr_k = matrix_lr * settings_[k].lr_scale;
    p.mul_(1.0 - lr_k * settings_[k].weight_decay);
    p.add_(orthogonal[a], -(lr_k * lr_ratios_[k]));
  }
}

std::unique_ptr<Optimizer> build_optimizer(std::vector<at::Tensor> params, const OptimizerConfig& config,
                                           const std::vector<std::string>& names, MuonOptions options) {
  if (config.name == OptimizerName::muon) {
    return std::make_unique<Muon>(std::move(params), config, names, std::move(options));
  }
  return std::make_unique<AdamW>(std::move(params), config, names, options.groups);
}

}  // namespace titan
