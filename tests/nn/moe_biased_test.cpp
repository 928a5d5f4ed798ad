// SPDX-License-Identifier: BSD-3-Clause
// The MoE's gpt-oss options (MoEArgs::gate_bias, biased_experts, activation): the grouped GEMM against its
// per-expert loop twin with biases and the clamped SwiGLU (bitwise in fp32 on CPU, values and gradients, as
// for the plain experts), both against the formula for one token, the padded CUDA layout run on CPU against
// the loop, the router's bias in selection and weights, the parameters and their init, and the config error.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

#include "test_util.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/moe.hpp"

namespace titan::test {
namespace {

constexpr int64_t E = 5, D = 16, F = 32;

nn::ExpertsVariant clamped(const std::vector<at::Tensor>& biases) {
  return {.b1 = biases[0],
          .b2 = biases[1],
          .b3 = biases[2],
          .activation = nn::ExpertActivation::clamped_swiglu,
          .alpha = 1.702,
          .limit = 1.5};
}

}  // namespace

TEST_CASE("moe: biased clamped experts, grouped GEMM equals the loop bitwise (values and gradients)", "[nn][moe]") {
  at::manual_seed(0);
  const at::Tensor counts = at::tensor({7, 0, 12, 3, 15}, at::kLong);  // expert 1 gets nothing
  std::vector<at::Tensor> leaves{at::randn({37, D}), at::randn({E, F, D}), at::randn({E, D, F}), at::randn({E, F, D}),
                                 at::randn({E, F}),  at::randn({E, D}),    at::randn({E, F})};
  for (auto& t : leaves) t.requires_grad_(true);
  const nn::ExpertsVariant variant = clamped({leaves[4], leaves[5], leaves[6]});
  const at::Tensor grouped = nn::experts_grouped_mm(leaves[0], leaves[1], leaves[2], leaves[3], counts, variant);
  const at::Tensor loop = nn::experts_loop(leaves[0], leaves[1], leaves[2], leaves[3], counts, variant);
  CHECK(at::equal(grouped, loop));
  const at::Tensor dy = at::randn_like(grouped);
  const auto g = torch::autograd::grad({grouped}, leaves, {dy});
  const auto l = torch::autograd::grad({loop}, leaves, {dy});
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("gradient " << i);
    CHECK(at::equal(g[i], l[i]));
  }
  CHECK(g[4][1].abs().max().item<float>() == 0.f);  // the empty expert's bias gets no gradient
  CHECK(g[4][0].abs().max().item<float>() > 0.f);
  // The clamp bites: x of std 1 against weights of std 1 gives gate/up values far past 1.5.
  CHECK(at::matmul(leaves[0].narrow(0, 0, 7), leaves[1][0].t()).abs().max().item<double>() > 1.5);

  // One token of expert 2 by the formula: g = min(w1 x + b1, L), u = clamp(w3 x + b3, -L, L),
  // y = w2 ((u + 1) g sigmoid(alpha g)) + b2.
  at::NoGradGuard no_grad;
  const at::Tensor x = leaves[0][7];                                                // expert 2's first token (D)
  const at::Tensor gate = (at::mv(leaves[1][2], x) + leaves[4][2]).clamp_max(1.5);  // (F)
  const at::Tensor up = (at::mv(leaves[3][2], x) + leaves[6][2]).clamp(-1.5, 1.5);  // (F)
  const at::Tensor want = at::mv(leaves[2][2], (up + 1) * gate * at::sigmoid(1.702 * gate)) + leaves[5][2];  // (D)
  CHECK(at::allclose(grouped[7], want, 1e-5, 1e-5));

  // CUDA's padded layout (run here on CPU in fp32): the same numbers, the biases found by padded row.
  const at::Tensor padded =
      nn::detail::experts_grouped_mm_padded(leaves[0], leaves[1], leaves[2], leaves[3], counts, at::kFloat, variant);
  CHECK(at::allclose(padded, loop, 1e-5, 1e-5));
}

TEST_CASE("moe: a biased router gate steers selection and weights, and biased experts have their parameters and init",
          "[nn][moe]") {
  nn::MoEArgs args{.num_experts = 4,
                   .num_shared_experts = 0,
                   .score_func = "softmax",
                   .route_norm = true,
                   .score_before_experts = false,
                   .top_k = 2,
                   .load_balance_coeff = 0.0,
                   .gate_bias = true,
                   .biased_experts = true,
                   .activation = nn::ExpertActivation::clamped_swiglu};
  nn::manual_init_seed(5);
  nn::MoE moe(args, D, F, at::TensorOptions());
  moe.init_weights(nn::InitSite::current() / "moe", 0.01);
  const auto params = moe.named_parameters();
  for (const char* name : {"router.gate.bias", "experts.w1_bias", "experts.w2_bias", "experts.w3_bias"}) {
    INFO(name);
    REQUIRE(params.contains(name));
  }
  CHECK(params["experts.w1_bias"].sizes() == at::IntArrayRef({4, F}));
  CHECK(params["experts.w2_bias"].sizes() == at::IntArrayRef({4, D}));
  CHECK(moe.router->gate->bias.eq(0).all().item<bool>());  // every expert starts level
  // torchtitan's gpt-oss init: w1 and the biases from the block's std (0.01), not w1's usual 0.02.
  CHECK(moe.experts->w1.std().item<double>() == Approx(0.01).epsilon(0.1));
  const at::Tensor biases = at::cat({moe.experts->w1_bias.flatten(), moe.experts->w2_bias.flatten(),
                                     moe.experts->w3_bias.flatten()});  // (2F + D) * 4 draws
  CHECK(biases.std().item<double>() == Approx(0.01).epsilon(0.2));
  CHECK(moe.experts->stacked_parameters().size() == 6);

  // Softmax of (0, 0, 0, 0) + bias (0, 3, 1, 2): experts 1 and 3 with weights e^3 / (e^3 + e^2) and the rest.
  {
    at::NoGradGuard no_grad;
    moe.router->gate->weight.zero_();
    moe.router->gate->bias.copy_(at::tensor({0.f, 3.f, 1.f, 2.f}));
  }
  const nn::Routing r = moe.router->forward(at::randn({1, D}));
  CHECK(r.selected_experts.equal(at::tensor({1, 3}, at::kLong).view({1, 2})));
  const double top = std::exp(3.0) / (std::exp(3.0) + std::exp(2.0));
  CHECK(r.top_scores[0][0].item<double>() == Approx(top).epsilon(1e-6));

  args.swiglu_limit = 0.0;
  CHECK_THROWS_WITH(nn::validate(args),
                    Catch::Contains("expected clamped_swiglu's swiglu_alpha and swiglu_limit > 0") &&
                        Catch::Contains("1.702 and 7.0"));
}

}  // namespace titan::test
