// SPDX-License-Identifier: BSD-3-Clause
// The MoE layer: the grouped GEMM against its per-expert loop twin (bitwise in fp32 on CPU, values and
// gradients), the padded bf16 layout CUDA's grouped GEMM runs on (on CPU, against the loop), routing
// (hand-computed sigmoid/softmax scores, deterministic ties, the expert bias steering selection only,
// node-limited groups), the whole layer against a token-by-token dense reference, the aux-loss-free
// bias update, and config errors.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "test_util.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/moe.hpp"

namespace titan::test {
namespace {

using nn::MoE;
using nn::MoEArgs;
using nn::TokenChoiceTopKRouter;

const at::TensorOptions kF32 = at::TensorOptions().dtype(at::kFloat);

std::vector<at::Tensor> grads(const at::Tensor& y, const std::vector<at::Tensor>& inputs, const at::Tensor& dy) {
  return torch::autograd::grad({y}, inputs, {dy});
}

// Router over D = 2 whose gate gives the single token x = (1, 0) the logits (1, 2, 0).
std::shared_ptr<TokenChoiceTopKRouter> router_with_logits_120(const MoEArgs& args) {
  auto r = std::make_shared<TokenChoiceTopKRouter>(2, args, kF32);
  at::NoGradGuard no_grad;
  r->gate->weight.copy_(at::tensor({1.f, 0.f, 2.f, 0.f, 0.f, 0.f}).view({3, 2}));
  return r;
}
const at::Tensor kToken = at::tensor({1.f, 0.f}).view({1, 2});

}  // namespace

TEST_CASE("moe: grouped GEMM equals the per-expert loop bitwise in fp32 (values and gradients)", "[nn][moe]") {
  at::manual_seed(0);
  const int64_t E = 5, D = 16, F = 32;
  at::Tensor counts = at::tensor({7, 0, 12, 3, 15}, at::kLong);        // expert 1 gets nothing
  at::Tensor x = at::randn({37, D}).requires_grad_(true);              // (N, D)
  at::Tensor w1 = at::randn({E, F, D}).requires_grad_(true);           // (E, F, D)
  at::Tensor w2 = at::randn({E, D, F}).requires_grad_(true);           // (E, D, F)
  at::Tensor w3 = at::randn({E, F, D}).requires_grad_(true);           // (E, F, D)
  at::Tensor grouped = nn::experts_grouped_mm(x, w1, w2, w3, counts);  // (N, D)
  at::Tensor loop = nn::experts_loop(x, w1, w2, w3, counts);           // (N, D)
  REQUIRE(grouped.sizes() == x.sizes());
  CHECK(at::equal(grouped, loop));
  at::Tensor dy = at::randn_like(grouped);
  auto g = grads(grouped, {x, w1, w2, w3}, dy);
  auto l = grads(loop, {x, w1, w2, w3}, dy);
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("gradient " << i);
    CHECK(at::equal(g[i], l[i]));
  }
  CHECK(g[1][1].abs().max().item<float>() == 0.f);  // the empty expert gets a zero gradient
  CHECK(g[1][0].abs().max().item<float>() > 0.f);

  // Rows that are not 16-byte aligned are refused with the way out.
  at::Tensor x_odd = at::randn({4, 6});
  at::Tensor w_odd = at::randn({1, 8, 6});
  CHECK_THROWS_WITH(nn::experts_grouped_mm(x_odd, w_odd, w_odd.transpose(1, 2), w_odd, at::tensor({4}, at::kLong)),
                    Catch::Contains("[titan::nn::MoE] expected dim and hidden_dim to be multiples of 4") &&
                        Catch::Contains("use_grouped_mm = false"));
}

TEST_CASE("moe: pad_expert_groups starts every group at a multiple of the alignment", "[nn][moe]") {
  {
    // By hand: groups of 3, 0 and 9 tokens at 4-row alignment take 4, 4 (all padding) and 12 rows.
    nn::detail::PaddedExpertGroups g = nn::detail::pad_expert_groups(at::tensor({3, 0, 9}, at::kLong), 12, 4);
    CHECK(g.offsets.equal(at::tensor({4, 8, 20}, at::kInt)));
    CHECK(g.rows.equal(at::tensor({0, 1, 2, 8, 9, 10, 11, 12, 13, 14, 15, 16}, at::kLong)));
    CHECK(g.padded_rows == 24);  // 12 + 3 * 4, a bound known without reading the counts
  }
  const std::vector<std::vector<int64_t>> cases = {
      {7, 0, 12, 3, 15}, {0, 37, 0, 0, 0}, {37, 0, 0, 0, 0}, {0, 0, 0, 0, 37}, {8, 16, 0, 1}, {0, 0, 0}, {5}};
  for (const auto& c : cases) {
    for (int64_t align : {1, 8, 16, 32}) {
      at::Tensor counts = at::tensor(c, at::kLong);  // (E)
      const int64_t n = counts.sum().item<int64_t>();
      INFO("counts " << counts << " align " << align);
      nn::detail::PaddedExpertGroups g = nn::detail::pad_expert_groups(counts, n, align);
      REQUIRE(g.offsets.scalar_type() == at::kInt);
      REQUIRE(g.rows.size(0) == n);
      CHECK(g.padded_rows % align == 0);
      int64_t start = 0, token = 0;
      for (size_t e = 0; e < c.size(); ++e) {
        const int64_t end = g.offsets[static_cast<int64_t>(e)].item<int64_t>();
        CHECK(start % align == 0);
        CHECK(end - start == std::max(align, (c[e] + align - 1) / align * align));
        for (int64_t i = 0; i < c[e]; ++i, ++token) CHECK(g.rows[token].item<int64_t>() == start + i);  // in order
        start = end;
      }
      CHECK(start <= g.padded_rows);

      at::Tensor x = at::randn({n, 8}) + 10.f;                // (N, D): no zero entries
      at::Tensor padded = nn::detail::pad_expert_rows(x, g);  // (P, D)
      REQUIRE(padded.size(0) == g.padded_rows);
      at::Tensor is_token = at::zeros({g.padded_rows}, at::kBool).index_fill_(0, g.rows, true);  // (P)
      CHECK(padded.index_select(0, g.rows).equal(x));
      CHECK(padded.index({is_token.logical_not()}).eq(0).all().item<bool>());  // every padding row is zero
      CHECK(nn::detail::unpad_expert_rows(padded, g).equal(x));
    }
  }
}

TEST_CASE("moe: the padded grouped GEMM (the CUDA path) equals a per-expert loop bitwise", "[nn][moe]") {
  at::manual_seed(6);
  const int64_t E = 5, D = 16, F = 32;
  // The reference: per expert, its tokens and zero rows up to the padded group size (a multiple of align,
  // align rows when it has none), one matmul chain, its token rows kept. The GEMMs run at the padded row
  // count because a CPU GEMM may round a row differently at another one (MKL's fp32 GEMM does for 3 rows
  // against 8); the unpadded loop is compared within rounding below.
  const auto padded_groups_loop = [&](const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
                                      const at::Tensor& w3, const std::vector<int64_t>& c, int64_t align) {
    std::vector<at::Tensor> outs;
    int64_t start = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = c[static_cast<size_t>(e)];
      const int64_t rows = std::max(align, (n + align - 1) / align * align);
      at::Tensor xe = at::constant_pad_nd(x.narrow(0, start, n), {0, 0, 0, rows - n});  // (rows, D)
      at::Tensor h = at::silu(at::matmul(xe, w1[e].t())) * at::matmul(xe, w3[e].t());   // (rows, F)
      outs.push_back(at::matmul(h, w2[e].t()).narrow(0, 0, n));                         // (n, D)
      start += n;
    }
    return at::cat(outs, 0);  // (N, D)
  };
  const std::vector<std::vector<int64_t>> cases = {{7, 0, 12, 3, 15}, {0, 37, 0, 0, 0}, {37, 0, 0, 0, 0}};
  for (const auto& c : cases) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const int64_t align = 16 / static_cast<int64_t>(c10::elementSize(dtype));                 // rows of 16 bytes
      at::Tensor counts = at::tensor(c, at::kLong);                                             // (E)
      at::Tensor x = at::randn({37, D}).requires_grad_(true);                                   // (N, D) fp32
      at::Tensor w1 = at::randn({E, F, D}).requires_grad_(true);                                // (E, F, D)
      at::Tensor w2 = at::randn({E, D, F}).requires_grad_(true);                                // (E, D, F)
      at::Tensor w3 = at::randn({E, F, D}).requires_grad_(true);                                // (E, F, D)
      at::Tensor padded = nn::detail::experts_grouped_mm_padded(x, w1, w2, w3, counts, dtype);  // (N, D) fp32
      at::Tensor reference =
          padded_groups_loop(x.to(dtype), w1.to(dtype), w2.to(dtype), w3.to(dtype), c, align).to(at::kFloat);  // (N, D)
      at::Tensor loop =
          nn::experts_loop(x.to(dtype), w1.to(dtype), w2.to(dtype), w3.to(dtype), counts).to(at::kFloat);  // (N, D)
      INFO("counts " << counts << " dtype " << dtype);
      REQUIRE(padded.scalar_type() == at::kFloat);
      CHECK(at::equal(padded, reference));
      const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
      CHECK(at::allclose(padded, loop, tol, tol));
      at::Tensor dy = at::randn_like(reference);
      auto g = grads(padded, {x, w1, w2, w3}, dy);
      auto r = grads(reference, {x, w1, w2, w3}, dy);
      for (size_t i = 0; i < g.size(); ++i) {
        INFO("gradient " << i);
        CHECK(at::equal(g[i], r[i]));
      }
      for (int64_t e = 0; e < E; ++e) {
        if (c[static_cast<size_t>(e)] == 0) CHECK(g[1][e].abs().max().item<float>() == 0.f);  // empty: zero gradient
      }
    }
  }
  // No tokens at all: every group is padding, and the result is empty.
  at::Tensor none =
      nn::detail::experts_grouped_mm_padded(at::zeros({0, D}), at::randn({E, F, D}), at::randn({E, D, F}),
                                            at::randn({E, F, D}), at::zeros({E}, at::kLong), at::kBFloat16);
  CHECK(none.sizes() == at::IntArrayRef({0, D}));

  // Rows aligned for fp32 (multiples of 4) but not for the bf16 GEMM (multiples of 8) are refused.
  at::Tensor x12 = at::randn({4, 12});
  at::Tensor w12 = at::randn({1, 8, 12});
  CHECK_THROWS_WITH(nn::detail::experts_grouped_mm_padded(x12, w12, w12.transpose(1, 2), w12,
                                                          at::tensor({4}, at::kLong), at::kBFloat16),
                    Catch::Contains("[titan::nn::MoE] expected dim and hidden_dim to be multiples of 8") &&
                        Catch::Contains("BFloat16"));
}

TEST_CASE("moe: the layer through grouped GEMM equals the layer through the loop bitwise", "[nn][moe]") {
  nn::manual_init_seed(1);
  for (bool before : {true, false}) {
    MoE moe(MoEArgs{.num_experts = 6, .score_func = "softmax", .score_before_experts = before, .top_k = 2}, 16, 32,
            kF32);
    moe.init_weights(nn::InitSite::current() / "moe", 0.1);
    at::manual_seed(2);
    at::Tensor x = at::randn({2, 9, 16}).requires_grad_(true);  // (B, S, D)
    std::vector<at::Tensor> inputs{x};
    for (const auto& p : moe.parameters()) inputs.push_back(p);
    moe.experts->use_grouped_mm = true;
    at::Tensor y_grouped = moe.forward(x);  // (B, S, D)
    moe.experts->use_grouped_mm = false;
    at::Tensor y_loop = moe.forward(x);  // (B, S, D)
    INFO("score_before_experts " << before);
    CHECK(at::equal(y_grouped, y_loop));
    at::Tensor dy = at::randn_like(y_loop);
    auto g = grads(y_grouped, inputs, dy);
    auto l = grads(y_loop, inputs, dy);
    for (size_t i = 0; i < g.size(); ++i) CHECK(at::equal(g[i], l[i]));
    CHECK(moe.tokens_per_expert.sum().item<float>() == 2 * 2 * 9 * 2);  // two forwards, 18 tokens, top-2
  }
}

TEST_CASE("moe: the layer equals a token-by-token dense reference", "[nn][moe]") {
  at::NoGradGuard no_grad;
  nn::manual_init_seed(3);
  for (bool before : {true, false}) {
    MoEArgs args{.num_experts = 4,
                 .num_shared_experts = 1,
                 .route_norm = true,
                 .route_scale = 1.5,
                 .score_before_experts = before,
                 .top_k = 2};
    MoE moe(args, 8, 16, kF32);
    moe.init_weights(nn::InitSite::current() / "moe", 0.1);
    at::manual_seed(4);
    at::Tensor x = at::randn({1, 5, 8});  // (B, S, D)
    at::Tensor y = moe.forward(x);        // (B, S, D)
    nn::Routing r = moe.router->forward(x.view({5, 8}), moe.expert_bias);
    at::Tensor expected = moe.shared_experts->forward(x).view({5, 8});  // (T, D)
    const auto& ex = *moe.experts;
    for (int64_t t = 0; t < 5; ++t) {
      at::Tensor xt = x[0][t];  // (D)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t e = r.selected_experts[t][j].item<int64_t>();
        // score_before_experts scales the expert's input (SwiGLU is not linear), else its output
        at::Tensor s = r.top_scores[t][j];
        at::Tensor xin = before ? s * xt : xt;                                                                   // (D)
        at::Tensor ffn = at::matmul(ex.w2[e], at::silu(at::matmul(ex.w1[e], xin)) * at::matmul(ex.w3[e], xin));  // (D)
        expected[t] += before ? ffn : s * ffn;
      }
    }
    INFO("score_before_experts " << before);
    CHECK(at::allclose(y.view({5, 8}), expected, /*rtol=*/1e-5, /*atol=*/1e-6));
  }
}

TEST_CASE("moe router: sigmoid and softmax scores match a hand computation", "[nn][moe]") {
  const double s0 = 1 / (1 + std::exp(-1.0)), s1 = 1 / (1 + std::exp(-2.0));  // sigmoid(1), sigmoid(2)
  {
    auto r = router_with_logits_120(MoEArgs{.num_experts = 3, .score_func = "sigmoid", .top_k = 2});
    nn::Routing out = r->forward(kToken);
    CHECK(out.selected_experts[0][0].item<int64_t>() == 1);
    CHECK(out.selected_experts[0][1].item<int64_t>() == 0);
    CHECK(out.top_scores[0][0].item<double>() == Approx(s1).epsilon(1e-6));
    CHECK(out.top_scores[0][1].item<double>() == Approx(s0).epsilon(1e-6));
    CHECK(out.tokens_per_expert.equal(at::tensor({1, 1, 0}, at::kLong)));
  }
  {
    auto r = router_with_logits_120(
        MoEArgs{.num_experts = 3, .score_func = "sigmoid", .route_norm = true, .route_scale = 2.5, .top_k = 2});
    nn::Routing out = r->forward(kToken);
    CHECK(out.top_scores[0][0].item<double>() == Approx(2.5 * s1 / (s0 + s1)).epsilon(1e-6));
    CHECK(out.top_scores[0][1].item<double>() == Approx(2.5 * s0 / (s0 + s1)).epsilon(1e-6));
  }
  {
    const double z = std::exp(1.0) + std::exp(2.0) + 1.0;
    auto r = router_with_logits_120(MoEArgs{.num_experts = 3, .score_func = "softmax", .route_scale = 2.0, .top_k = 3});
    nn::Routing out = r->forward(kToken);
    CHECK(out.selected_experts.equal(at::tensor({1, 0, 2}, at::kLong).view({1, 3})));
    CHECK(out.top_scores[0][0].item<double>() == Approx(2.0 * std::exp(2.0) / z).epsilon(1e-6));
    CHECK(out.top_scores[0][1].item<double>() == Approx(2.0 * std::exp(1.0) / z).epsilon(1e-6));
    CHECK(out.top_scores[0][2].item<double>() == Approx(2.0 / z).epsilon(1e-6));
  }
}

TEST_CASE("moe router: the expert bias changes selection, not the combine weights", "[nn][moe]") {
  auto r = router_with_logits_120(MoEArgs{.num_experts = 3, .score_func = "sigmoid", .top_k = 2});
  at::Tensor bias = at::tensor({0.f, 0.f, 1.f});  // sigmoid + bias = (0.73, 0.88, 1.5)
  nn::Routing out = r->forward(kToken, bias);
  CHECK(out.selected_experts.equal(at::tensor({2, 1}, at::kLong).view({1, 2})));
  CHECK(out.top_scores[0][0].item<double>() == Approx(0.5).epsilon(1e-6));  // sigmoid(0), no bias
  CHECK(out.top_scores[0][1].item<double>() == Approx(1 / (1 + std::exp(-2.0))).epsilon(1e-6));
}

TEST_CASE("moe router: ties go to the lower expert and group index", "[nn][moe]") {
  at::manual_seed(5);
  at::Tensor x = at::randn({64, 4});  // (T, D)
  {
    // Experts 1 and 3 share a dominant gate row: every token ties between them, then among 0 and 2.
    TokenChoiceTopKRouter r(4, MoEArgs{.num_experts = 4, .score_func = "softmax", .top_k = 3}, kF32);
    at::NoGradGuard no_grad;
    r.gate->weight.zero_();
    r.gate->weight[1].fill_(100.f);
    r.gate->weight[3].fill_(100.f);
    at::Tensor xp = x.abs();  // positive logits for experts 1 and 3, zero for 0 and 2
    nn::Routing out = r.forward(xp);
    at::Tensor expected = at::tensor({1, 3, 0}, at::kLong).expand({64, 3});
    CHECK(out.selected_experts.equal(expected));
  }
  {
    // All scores equal, eight experts in four groups, two groups allowed: groups 0 and 1, experts 0..2.
    TokenChoiceTopKRouter r(4, MoEArgs{.num_experts = 8, .top_k = 3, .num_expert_groups = 4, .num_limited_groups = 2},
                            kF32);
    at::NoGradGuard no_grad;
    r.gate->weight.zero_();
    nn::Routing out = r.forward(x);
    CHECK(out.selected_experts.equal(at::tensor({0, 1, 2}, at::kLong).expand({64, 3})));
    CHECK(out.tokens_per_expert.equal(at::tensor({64, 64, 64, 0, 0, 0, 0, 0}, at::kLong)));
  }
  {
    // Node-limited: group 1 (experts 2, 3) holds the best pair, so top-2 stays inside it even though
    // expert 4 alone scores higher than expert 3.
    TokenChoiceTopKRouter r(1, MoEArgs{.num_experts = 6, .top_k = 2, .num_expert_groups = 3, .num_limited_groups = 1},
                            kF32);
    at::NoGradGuard no_grad;
    r.gate->weight.copy_(at::tensor({0.f, 0.f, 3.f, 1.f, 2.f, -5.f}).view({6, 1}));
    nn::Routing out = r.forward(at::ones({1, 1}));
    CHECK(out.selected_experts.equal(at::tensor({2, 3}, at::kLong).view({1, 2})));
  }
}

TEST_CASE("moe: update_expert_bias moves the bias toward balance", "[nn][moe]") {
  const double c = 1e-3;
  {
    MoE moe(MoEArgs{.num_experts = 4, .num_shared_experts = 0, .load_balance_coeff = c}, 4, 8, kF32);
    moe.init_weights(nn::InitSite::current() / "moe", 0.02);
    moe.tokens_per_expert.copy_(at::tensor({10.f, 0.f, 2.f, 4.f}));  // mean 4
    moe.update_expert_bias(c);
    // d = c * sign(4 - load) = c * (-1, 1, 1, 0); bias += d - mean(d) = c * (-1.25, 0.75, 0.75, -0.25)
    at::Tensor expected = at::tensor({-1.25f, 0.75f, 0.75f, -0.25f}) * c;
    CHECK(at::allclose(moe.expert_bias, expected, 0, 1e-9));
    CHECK(moe.tokens_per_expert.sum().item<float>() == 0.f);
  }
  {
    // A constant gate sends every token to expert 0 (a tie); one update steers them elsewhere.
    MoE moe(MoEArgs{.num_experts = 4, .num_shared_experts = 0, .top_k = 1, .load_balance_coeff = c}, 4, 8, kF32);
    moe.init_weights(nn::InitSite::current() / "moe", 0.02);
    {
      at::NoGradGuard no_grad;
      moe.router->gate->weight.zero_();
    }
    at::Tensor x = at::randn({1, 16, 4});  // (B, S, D)
    moe.forward(x);
    CHECK(moe.tokens_per_expert.equal(at::tensor({16.f, 0.f, 0.f, 0.f})));
    moe.update_expert_bias(c);
    CHECK(moe.expert_bias[0].item<float>() < moe.expert_bias[1].item<float>());
    moe.forward(x);
    CHECK(moe.tokens_per_expert[0].item<float>() == 0.f);
    CHECK(moe.tokens_per_expert[1].item<float>() == 16.f);
  }
  {
    MoE moe(MoEArgs{.num_experts = 4, .load_balance_coeff = 0.0}, 4, 8, kF32);
    CHECK_FALSE(moe.expert_bias.defined());
    moe.update_expert_bias(c);  // no bias: nothing to do
  }
}

TEST_CASE("moe: a bad config is refused with the fix", "[nn][moe]") {
  CHECK_THROWS_WITH(nn::validate(MoEArgs{.num_experts = 4, .top_k = 5}),
                    Catch::Contains("[titan::nn::MoE] expected 1 <= top_k <= num_experts (4), got top_k 5"));
  CHECK_THROWS_WITH(
      nn::validate(MoEArgs{.num_experts = 8, .top_k = 2, .num_expert_groups = 4, .num_limited_groups = 5}),
      Catch::Contains("[titan::nn::MoE] expected 1 <= num_limited_groups <= num_expert_groups (4), got 5"));
  CHECK_THROWS_WITH(
      nn::validate(MoEArgs{.num_experts = 9, .top_k = 2, .num_expert_groups = 4, .num_limited_groups = 2}),
      Catch::Contains("[titan::nn::MoE] expected num_experts divisible by num_expert_groups, got 9 experts in 4"));
  CHECK_THROWS_WITH(nn::validate(MoEArgs{.score_func = "relu"}),
                    Catch::Contains("expected score_func \"softmax\" or \"sigmoid\", got \"relu\""));
  CHECK_THROWS_WITH(
      nn::validate(MoEArgs{.num_experts = 8, .top_k = 5, .num_expert_groups = 4, .num_limited_groups = 2}),
      Catch::Contains("top_k <= num_limited_groups * experts per group (2 * 2), got top_k 5"));
  CHECK_THROWS_WITH(MoE(MoEArgs{.num_experts = 2, .top_k = 3}, 4, 8, kF32), Catch::Contains("[titan::nn::MoE]"));
  CHECK_NOTHROW(nn::validate(MoEArgs{}));
}

}  // namespace titan::test
