// SPDX-License-Identifier: BSD-3-Clause
// AdamW: the fused kernel and the foreach path equal the plain for-loop reference over several
// steps, the reference equals a hand-computed scalar update, and clipping bounds the norm.
#include <ATen/ATen.h>

#include <fmt/format.h>

#include <cmath>

#include "test_util.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/optim/clip.hpp"

namespace {
std::vector<at::Tensor> make_params(int seed) {
  at::manual_seed(seed);
  return {at::randn({7, 5}).requires_grad_(), at::randn({3}).requires_grad_(), at::randn({2, 2, 2}).requires_grad_()};
}

std::vector<at::Tensor> run(titan::OptimizerImplementation impl, int steps,
                            titan::OptimizerName name = titan::OptimizerName::adamw) {
  auto params = make_params(11);
  titan::AdamW opt(params, {.name = name, .lr = 1e-2, .weight_decay = 0.1, .implementation = impl});
  for (int s = 0; s < steps; ++s) {
    at::manual_seed(100 + s);
    for (auto& p : params) p.mutable_grad() = at::randn_like(p);
    opt.step(1e-2 * (s + 1) / steps);
  }
  return params;
}
}  // namespace

TEST_CASE("adamw implementations agree", "[optim][adamw]") {
  using titan::OptimizerImplementation;
  for (const auto name : {titan::OptimizerName::adamw, titan::OptimizerName::adam}) {
    const auto ref = run(OptimizerImplementation::for_loop, 5, name);
    for (const auto impl : {OptimizerImplementation::fused, OptimizerImplementation::foreach}) {
      const auto got = run(impl, 5, name);
      for (size_t i = 0; i < ref.size(); ++i) {
        INFO(fmt::format("{} {} param {} max diff {}", name, impl, i, (got[i] - ref[i]).abs().max().item<double>()));
        // fp32, different op order inside the kernels: a few ulps.
        CHECK(at::allclose(got[i], ref[i], 1e-5, 1e-6));
      }
    }
  }
  // Adam's L2 decay goes through the moments; AdamW's does not: the two differ.
  CHECK_FALSE(at::allclose(run(OptimizerImplementation::for_loop, 5, titan::OptimizerName::adam)[0],
                           run(OptimizerImplementation::for_loop, 5)[0]));
}

TEST_CASE("adamw reference equals the closed-form first step", "[optim][adamw]") {
  at::Tensor p = at::full({1}, 2.0).requires_grad_();
  titan::AdamW opt({p}, {.lr = 0.1,
                         .beta1 = 0.9,
                         .beta2 = 0.95,
                         .eps = 1e-8,
                         .weight_decay = 0.1,
                         .implementation = titan::OptimizerImplementation::for_loop});
  p.mutable_grad() = at::full({1}, 0.5);
  opt.step(0.1);
  // Step 1: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps) after decay p *= 1 - lr*wd.
  const double expected = 2.0 * (1 - 0.1 * 0.1) - 0.1 * 0.5 / (0.5 + 1e-8);
  CHECK(p.item<double>() == Approx(expected).epsilon(1e-6));
  opt.zero_grad();
  CHECK_FALSE(p.grad().defined());
  // The state a checkpoint sees, through the Optimizer interface.
  const titan::Optimizer& base = opt;
  const std::vector<titan::ParamState> state = base.state(0);
  REQUIRE(state.size() == 3);
  CHECK(state[0].name == "exp_avg");
  CHECK(state[1].name == "exp_avg_sq");
  CHECK(state[2].name == "step");
  CHECK(state[0].like_param);
  CHECK_FALSE(state[2].like_param);
  CHECK(state[2].tensor.item<double>() == 1.0);
  CHECK(base.state_bytes() == 3 * 4);
}

TEST_CASE("global-norm clipping", "[optim][clip]") {
  at::Tensor a = at::zeros({2}).requires_grad_();
  at::Tensor b = at::zeros({1}).requires_grad_();
  a.mutable_grad() = at::tensor({3.0f, 0.0f});
  b.mutable_grad() = at::tensor({4.0f});
  const double norm = titan::clip_grad_norm_({a, b}, 1.0);
  CHECK(norm == Approx(5.0));
  CHECK(titan::grad_norm({a, b}).item<double>() == Approx(1.0).epsilon(1e-5));
  CHECK(a.grad()[0].item<double>() == Approx(0.6).epsilon(1e-5));
  // Below the threshold nothing changes.
  CHECK(titan::clip_grad_norm_({a, b}, 10.0) == Approx(1.0).epsilon(1e-5));
  CHECK(b.grad()[0].item<double>() == Approx(0.8).epsilon(1e-5));
}
