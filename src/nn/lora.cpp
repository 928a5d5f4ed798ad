// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/lora.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/layers.hpp"
#include "titan/nn/moe.hpp"

namespace titan::nn {
namespace {

// Glob of one dotted path: '*' stands for any characters but '.', everything else for itself.
bool glob_match(std::string_view pattern, std::string_view text) {
  if (pattern.empty()) return text.empty();
  if (pattern[0] == '*') {
    for (size_t i = 0;; ++i) {
      if (glob_match(pattern.substr(1), text.substr(i))) return true;
      if (i == text.size() || text[i] == '.') return false;
    }
  }
  return !text.empty() && pattern[0] == text[0] && glob_match(pattern.substr(1), text.substr(1));
}

// The Linears add_lora may adapt, by path: every titan::nn::Linear but a MoE router's gate and an adapter itself.
std::vector<std::pair<std::string, Linear*>> eligible_linears(torch::nn::Module& model) {
  std::vector<std::string> routers;
  std::vector<std::pair<std::string, Linear*>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& path = item.key();
    if (dynamic_cast<TokenChoiceTopKRouter*>(item.value().get()) != nullptr) routers.push_back(path + ".");
    auto* linear = dynamic_cast<Linear*>(item.value().get());
    if (linear == nullptr || path.ends_with(".lora_a") || path.ends_with(".lora_b")) continue;
    if (std::any_of(routers.begin(), routers.end(), [&](const std::string& r) { return path.starts_with(r); }))
      continue;
    out.emplace_back(path, linear);
  }
  return out;
}

std::string last_name(const std::string& path) { return path.substr(path.rfind('.') + 1); }

}  // namespace

LoraOptions lora_options(const LoraConfig& config) {
  return {
      .rank = config.rank, .alpha = config.alpha, .dropout = config.dropout, .target_modules = config.target_modules};
}

bool lora_target_matches(std::string_view pattern, std::string_view path) {
  for (size_t start = 0;; ++start) {
    if ((start == 0 || path[start - 1] == '.') && glob_match(pattern, path.substr(start))) return true;
    if (start == path.size()) return false;
  }
}

bool is_lora_param(std::string_view fqn) { return fqn.ends_with(".lora_a.weight") || fqn.ends_with(".lora_b.weight"); }

LoraConversion add_lora(torch::nn::Module& model, const LoraOptions& options) {
  TITAN_CHECK_VALUE(options.rank > 0, "[titan::nn::add_lora] expected lora.rank > 0, got {}. Set lora.rank (e.g. 8).",
                    options.rank);
  TITAN_CHECK_VALUE(options.alpha > 0,
                    "[titan::nn::add_lora] expected lora.alpha > 0, got {}. Set lora.alpha (e.g. 16).", options.alpha);
  TITAN_CHECK_VALUE(options.dropout >= 0 && options.dropout < 1,
                    "[titan::nn::add_lora] expected lora.dropout in [0, 1), got {}. Set lora.dropout (0 = none).",
                    options.dropout);
  const auto linears = eligible_linears(model);
  std::vector<std::pair<std::string, Linear*>> targets;
  for (const auto& [path, linear] : linears) {
    const bool wanted = options.target_modules.empty() ||
                        std::any_of(options.target_modules.begin(), options.target_modules.end(),
                                    [&](const std::string& p) { return lora_target_matches(p, path); });
    if (wanted) targets.emplace_back(path, linear);
  }
  for (const std::string& pattern : options.target_modules) {
    if (!options.require_matches || std::any_of(targets.begin(), targets.end(),
                                                [&](const auto& t) { return lora_target_matches(pattern, t.first); })) {
      continue;
    }
    std::set<std::string> names;
    for (const auto& [path, _] : linears) names.insert(last_name(path));
    TITAN_CHECK_VALUE(false,
                      "[titan::nn::add_lora] expected each lora.target_modules entry to match a Linear of the model, "
                      "got '{}' matching none (its Linears are named {}; MoE routers and routed experts take no "
                      "adapters). Fix or remove the entry.",
                      pattern, fmt::join(names, ", "));
  }
  LoraConversion report;
  for (const auto& [path, linear] : targets) {
    TITAN_CHECK_VALUE(linear->lora == nullptr,
                      "[titan::nn::add_lora] expected '{}' without adapters, got one from an earlier conversion. "
                      "Name lora once in model.converters.",
                      path);
    TITAN_CHECK_VALUE(parallel::sharded_param(linear->weight) == nullptr,
                      "[titan::nn::add_lora] expected a model not parallelized yet, got '{}.weight' sharded. Convert "
                      "before titan::parallelize, as the Trainer does.",
                      path);
    const at::TensorOptions where = linear->weight.options();
    const int64_t out = linear->weight.size(0);
    const int64_t in = linear->weight.size(1);
    auto a = linear->register_module("lora_a", std::make_shared<Linear>(in, options.rank, where));
    auto b = linear->register_module("lora_b", std::make_shared<Linear>(options.rank, out, where));
    linear->lora = std::make_shared<const LowRankAdapter>(
        LowRankAdapter{.a = std::move(a),
                       .b = std::move(b),
                       .scale = options.alpha / static_cast<double>(options.rank),
                       .dropout = options.dropout});
    report.adapted.push_back(path);
  }
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    at::Tensor p = item.value();
    const bool adapter = is_lora_param(item.key());
    p.requires_grad_(adapter);
    (adapter ? report.adapter_params : report.frozen_params) += p.numel();
  }
  report.linears = static_cast<int64_t>(linears.size());
  return report;
}

void init_lora(torch::nn::Module& model) {
  const InitSite root = InitSite::current();
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* linear = dynamic_cast<Linear*>(item.value().get());
    if (linear == nullptr || !linear->lora) continue;
    at::Tensor& a = linear->lora->a->weight;  // (rank, in), or its shard
    const parallel::ShardedParam* sharded = parallel::sharded_param(a);
    const int64_t fan_in = sharded != nullptr ? sharded->global_shape[1] : a.size(1);
    // torch.nn.init.kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in).
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    uniform_(a, root / item.key() / "lora_a.weight", -bound, bound);
    zeros_(linear->lora->b->weight);
  }
}

}  // namespace titan::nn
