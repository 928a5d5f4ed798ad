// SPDX-License-Identifier: BSD-3-Clause
// AdamW's parameter groups by name: each parameter steps with the weight decay and lr scale of the first group whose
// pattern its name matches (explicit groups, then optimizer.exclude_from_weight_decay's no-decay ones), in every
// implementation, against AdamW written out in double precision (fp32 kernels: 1e-5 relative). The state stays one
// entry per parameter, as checkpoints key it by name.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "test_util.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/optim/adamw.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace param_groups_test {

using namespace titan;

namespace {

const std::vector<std::string> kNames = {"wte.weight", "h.0.attn.wq.weight", "h.0.attn.wq.bias", "ln_f.weight"};

std::vector<at::Tensor> make_params() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  return {at::randn({6, 4}, gen).requires_grad_(), at::randn({4, 4}, gen).requires_grad_(),
          at::randn({4}, gen).requires_grad_(), at::randn({4}, gen).add_(1).requires_grad_()};
}

at::Tensor grad_of(const at::Tensor& p, int64_t step, size_t i) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + 10 * step + static_cast<int64_t>(i));
  return at::randn(p.sizes(), gen);
}

constexpr double kLr = 1e-2;
constexpr int64_t kSteps = 3;
const OptimizerConfig kConfig{.lr = kLr, .weight_decay = 0.1, .exclude_from_weight_decay = {"bias$", "^ln_"}};
// The embedding at half the lr and its own decay; the rest as the config says.
const std::vector<ParamGroup> kGroups = {{.pattern = "^wte\\.", .weight_decay = 0.05, .lr_scale = 0.5}};
// What each of kNames steps with: (weight decay, lr scale).
const std::pair<double, double> kExpected[] = {{0.05, 0.5}, {0.1, 1.0}, {0.0, 1.0}, {0.0, 1.0}};

// AdamW in double precision: decay, moments, bias-corrected update (torch.optim.AdamW).
std::vector<at::Tensor> reference(const OptimizerConfig& c) {
  std::vector<at::Tensor> params = make_params();
  std::vector<at::Tensor> p, m, v;
  for (const at::Tensor& t : params) {
    p.push_back(t.detach().to(at::kDouble));
    m.push_back(at::zeros_like(p.back()));
    v.push_back(at::zeros_like(p.back()));
  }
  for (int64_t step = 1; step <= kSteps; ++step) {
    for (size_t i = 0; i < p.size(); ++i) {
      const auto [weight_decay, lr_scale] = kExpected[i];
      const double lr = kLr * lr_scale;
      const at::Tensor g = grad_of(params[i], step, i).to(at::kDouble);
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * g;
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * g * g;
      const double bc1 = 1 - std::pow(c.beta1, static_cast<double>(step));
      const double bc2 = 1 - std::pow(c.beta2, static_cast<double>(step));
      p[i] = p[i] * (1 - lr * weight_decay) - lr * (m[i] / bc1) / (at::sqrt(v[i] / bc2) + c.eps);
    }
  }
  return p;
}

}  // namespace

TEST_CASE("AdamW steps each parameter group with its own weight decay and lr scale", "[optim][adamw][groups]") {
  const std::vector<at::Tensor> want = reference(kConfig);
  for (const auto impl : {OptimizerImplementation::for_loop, OptimizerImplementation::foreach,
                          OptimizerImplementation::fused, OptimizerImplementation::fused_opt_states_bf16}) {
    std::vector<at::Tensor> params = make_params();
    OptimizerConfig config = kConfig;
    config.implementation = impl;
    AdamW optimizer(params, config, kNames, kGroups);
    for (size_t i = 0; i < params.size(); ++i) {
      INFO(kNames[i]);
      CHECK(optimizer.settings(i).weight_decay == kExpected[i].first);
      CHECK(optimizer.settings(i).lr_scale == kExpected[i].second);
      CHECK(optimizer.state(i).size() == 3);  // exp_avg, exp_avg_sq, step: checkpoints key them by the name
    }
    for (int64_t step = 1; step <= kSteps; ++step) {
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grad_of(params[i], step, i);
      optimizer.step(kLr);
    }
    // bf16 moments round each moment to 8 bits of mantissa: 1e-2 of an update of lr.
    const double atol = impl == OptimizerImplementation::fused_opt_states_bf16 ? 1e-2 * kLr : 1e-7;
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor got = params[i].detach().to(at::kDouble);
      INFO(fmt::format("{} {}: max diff {}", impl, kNames[i], (got - want[i]).abs().max().item<double>()));
      CHECK(at::allclose(got, want[i], 1e-5, atol));
    }
  }
  // The groups matter: without them every parameter decays at the config's rate with the full lr.
  std::vector<at::Tensor> plain = make_params();
  AdamW ungrouped(plain, {.lr = kLr, .weight_decay = 0.1});
  for (int64_t step = 1; step <= kSteps; ++step) {
    for (size_t i = 0; i < plain.size(); ++i) plain[i].mutable_grad() = grad_of(plain[i], step, i);
    ungrouped.step(kLr);
  }
  for (size_t i : {size_t{0}, size_t{2}, size_t{3}}) {
    CHECK_FALSE(at::allclose(plain[i].detach().to(at::kDouble), want[i], 1e-5, 1e-7));
  }
}

TEST_CASE("optimizer.exclude_from_weight_decay is a config key and its groups need the parameters' names",
          "[optim][adamw][groups][config]") {
  JobConfig config;
  apply_override(config, "optimizer.exclude_from_weight_decay", "bias,norm,embeddings");
  CHECK(config.optimizer.exclude_from_weight_decay == std::vector<std::string>{"bias", "norm", "embeddings"});
  const std::vector<ParamGroup> groups = param_groups(config.optimizer);
  REQUIRE(groups.size() == 3);
  CHECK(groups[1].pattern == "norm");
  CHECK(groups[1].weight_decay == 0.0);
  const std::vector<at::Tensor> params = make_params();
  CHECK_THAT(test::error_of([&] { AdamW optimizer(params, config.optimizer); }),
             Catch::Contains("expected a name for each of the 4 parameters"));
  OptimizerConfig bad = kConfig;
  bad.exclude_from_weight_decay = {"(bias"};
  CHECK_THAT(test::error_of([&] { AdamW optimizer(params, bad, kNames); }),
             Catch::Contains("optimizer.exclude_from_weight_decay") && Catch::Contains("'(bias'"));
}

}  // namespace param_groups_test
