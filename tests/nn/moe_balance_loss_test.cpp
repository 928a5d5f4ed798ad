// SPDX-License-Identifier: BSD-3-Clause
// DeepSeek-V3's sequence-wise auxiliary balance loss (MoEArgs::load_balance_loss_weight): the layer's injected
// gradient equals the gradient of a plain ATen formula of eqs. 17-20 written here from the router's scores,
// its recorded value equals that formula, the loss's gradient agrees with a central finite difference in fp64,
// a layer without the loss (or a forward without grad) injects nothing, and a negative weight is refused.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

#include "test_util.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/moe.hpp"

namespace titan::test {
namespace {

constexpr int64_t kBatch = 3;
constexpr int64_t kSeq = 5;
constexpr int64_t kDim = 8;
constexpr int64_t kHidden = 16;
constexpr double kAlpha = 0.3;  // large, so the auxiliary term moves the gate gradient well past rounding

nn::MoEArgs args(const std::string& score_func, double alpha) {
  return {.num_experts = 6,
          .num_shared_experts = 0,
          .score_func = score_func,
          .route_norm = true,
          .top_k = 2,
          .use_grouped_mm = false,  // the loop runs in fp64 too (the gradient check)
          .load_balance_coeff = 0.0,
          .load_balance_loss_weight = alpha};
}

std::shared_ptr<nn::MoE> make_moe(const nn::MoEArgs& a, at::ScalarType dtype) {
  nn::manual_init_seed(11);
  auto moe = std::make_shared<nn::MoE>(a, kDim, kHidden, at::TensorOptions().dtype(dtype));
  moe->init_weights(nn::InitSite::current() / "moe", 0.02);
  at::NoGradGuard no_grad;
  moe->router->gate->weight.mul_(20.0);  // spread the scores: no top-2 choice within rounding of a tie
  return moe;
}

// Eqs. 17-20 from scratch: the same gate, scores and top-k, then per sequence f_i (counts) and P_i.
at::Tensor reference_loss(const nn::MoE& moe, const at::Tensor& x, double alpha, double scale) {
  const int64_t e = moe.args.num_experts, k = moe.args.top_k;
  at::Tensor logits = at::matmul(x.reshape({-1, kDim}), moe.router->gate->weight.t()).to(at::kFloat);     // (T, E)
  at::Tensor scores = moe.args.score_func == "softmax" ? at::softmax(logits, -1) : at::sigmoid(logits);   // (T, E)
  at::Tensor chosen = at::zeros_like(scores).scatter_(1, std::get<1>(scores.detach().topk(k, -1)), 1.0);  // (T, E)
  at::Tensor f = chosen.view({kBatch, kSeq, e}).sum(1) * (static_cast<double>(e) / (k * kSeq));           // (B, E)
  at::Tensor p = (scores / scores.sum(-1, true)).view({kBatch, kSeq, e}).mean(1);                         // (B, E)
  return alpha * scale * (f * p).sum();
}

}  // namespace

TEST_CASE("moe aux loss: the injected gradient equals a plain ATen formula's", "[nn][moe][aux_loss]") {
  for (const std::string score_func : {"softmax", "sigmoid"}) {
    INFO(score_func);
    auto with = make_moe(args(score_func, kAlpha), at::kFloat);
    auto without = make_moe(args(score_func, 0.0), at::kFloat);
    with->aux_loss_scale = without->aux_loss_scale = 0.25;  // as the Trainer sets 1 / sequences per step
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    const at::Tensor x = at::randn({kBatch, kSeq, kDim}, gen);   // (B, S, D)
    const at::Tensor dy = at::randn({kBatch, kSeq, kDim}, gen);  // (B, S, D): an arbitrary upstream gradient
    // The layer with the loss: its output's backward also carries the auxiliary term.
    const at::Tensor y = with->forward(x);
    const auto got = torch::autograd::grad({(y * dy).sum()}, {with->router->gate->weight, with->experts->w1});
    // The same weights without it, plus the formula written out.
    const at::Tensor y0 = without->forward(x);
    const at::Tensor ref = reference_loss(*without, x, kAlpha, 0.25);
    const auto want =
        torch::autograd::grad({(y0 * dy).sum() + ref}, {without->router->gate->weight, without->experts->w1});
    CHECK(at::equal(y, y0));  // the injection leaves the output's values alone
    CHECK(with->aux_loss.item<double>() == Approx(ref.item<double>()).epsilon(1e-6));
    CHECK(ref.item<double>() > 0);
    // fp32 sums in another order: 1e-5 relative, 1e-7 absolute on gradients of order 1e-2.
    CHECK(at::allclose(got[0], want[0], 1e-5, 1e-7));
    CHECK(at::allclose(got[1], want[1], 1e-5, 1e-7));  // the experts see no auxiliary gradient
    // The auxiliary term really reaches the gate: without it the gradient differs.
    const auto plain = torch::autograd::grad({(without->forward(x) * dy).sum()}, {without->router->gate->weight});
    CHECK((plain[0] - got[0]).abs().max().item<double>() > 1e-4);
  }
}

TEST_CASE("moe aux loss: sequence_balance_loss's gradient agrees with a central difference in fp64",
          "[nn][moe][aux_loss]") {
  // The router scores in fp32 whatever the weights' dtype, so the check runs on the loss function itself, in
  // fp64: scores (B*S, E) positive, a fixed top-2 choice (f counts it; it is not differentiable).
  constexpr int64_t kExperts = 6;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor scores = at::rand({kBatch * kSeq, kExperts}, gen, at::kDouble) + 0.1;  // (B*S, E)
  const at::Tensor selected = std::get<1>(scores.topk(2, -1));                            // (B*S, 2)
  const at::Tensor leaf = scores.clone().requires_grad_(true);
  const at::Tensor analytic =
      torch::autograd::grad({nn::sequence_balance_loss(leaf, selected, kBatch, kAlpha)}, {leaf})[0];  // (B*S, E)
  constexpr double kEps = 1e-6;
  for (const int64_t i : {0, 7, 20, 41, 89}) {
    const auto loss_at = [&](double delta) {
      at::Tensor moved = scores.clone();
      moved.view({-1})[i] += delta;
      return nn::sequence_balance_loss(moved, selected, kBatch, kAlpha).item<double>();
    };
    const double numeric = (loss_at(kEps) - loss_at(-kEps)) / (2 * kEps);
    INFO("score element " << i);
    // fp64 central difference: truncation ~eps^2 and rounding ~1e-16 / eps, both far below 1e-7.
    CHECK(analytic.view({-1})[i].item<double>() == Approx(numeric).epsilon(1e-7).margin(1e-10));
  }
  // The value: alpha * sum_b sum_i f_bi P_bi, where sum_i f_bi = E (every token picks K experts) and each P_b
  // sums to 1, so a perfectly even sequence gives alpha per sequence; any value is positive.
  CHECK(nn::sequence_balance_loss(scores, selected, kBatch, kAlpha).item<double>() > 0);
}

TEST_CASE("moe aux loss: off by default, nothing injected, and a negative weight is refused", "[nn][moe][aux_loss]") {
  auto moe = make_moe(args("softmax", 0.0), at::kFloat);
  const at::Tensor x = at::randn({kBatch, kSeq, kDim});
  const at::Tensor y = moe->forward(x);
  CHECK(y.grad_fn()->name() != "titan::nn::InjectAuxLoss");
  CHECK(moe->aux_loss.item<double>() == 0.0);
  auto on = make_moe(args("softmax", kAlpha), at::kFloat);
  CHECK(on->forward(x).grad_fn()->name() == "titan::nn::InjectAuxLoss");
  {
    at::NoGradGuard no_grad;  // an evaluation forward: no objective to add to
    CHECK(on->forward(x).grad_fn() == nullptr);
  }
  CHECK_THROWS_WITH(nn::validate(args("softmax", -1.0)),
                    Catch::Contains("expected load_balance_loss_weight >= 0, got -1"));
}

}  // namespace titan::test
