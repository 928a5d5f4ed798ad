// SPDX-License-Identifier: BSD-3-Clause
// The fused CPU cross-entropy against its ATen twin (log-softmax of the fp32-upcast logits, summed nll):
// loss and gradient, fp32 and bf16 logits, every build this CPU runs, ignored labels, a vocabulary that
// is not a multiple of the vector width, extreme logits; the dispatch and the refusal of a bad label.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include <cmath>

#include "test_util.hpp"
#include "titan/nn/detail/fused_cross_entropy.hpp"
#include "titan/nn/loss.hpp"

namespace {

struct Case {
  int64_t batch;
  int64_t seq;
  int64_t vocab;
  double spread;  ///< the logits' standard deviation
  double offset;  ///< added to every logit: the log-sum-exp must shift for range
};

struct Result {
  at::Tensor loss;  // ()
  at::Tensor grad;  // (B, S, V) in the logits' dtype
};

at::Tensor logits_of(const Case& c, at::ScalarType dtype) {
  at::manual_seed(static_cast<uint64_t>(c.vocab * 31 + c.seq));
  return (at::randn({c.batch, c.seq, c.vocab}) * c.spread + c.offset).to(dtype);  // (B, S, V)
}

at::Tensor labels_of(const Case& c) {
  at::Tensor labels = at::randint(c.vocab, {c.batch, c.seq}, at::kLong);  // (B, S)
  labels.index_put_({0, 1}, titan::kIgnoreIndex);
  labels.index_put_({c.batch - 1, c.seq - 1}, titan::kIgnoreIndex);
  return labels;
}

// Loss and gradient through `loss_fn`, the loss scaled before backward so the kernel's gradient scale is
// exercised.
template <class LossFn>
Result run(const at::Tensor& logits, const at::Tensor& labels, LossFn&& loss_fn) {
  const at::Tensor leaf = logits.detach().clone().requires_grad_();  // (B, S, V)
  const at::Tensor loss = loss_fn(leaf, labels);                     // ()
  (loss * 0.37).backward();
  return {loss.detach(), leaf.grad()};
}

double relative(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().item<double>() / std::max(1e-30, b.abs().item<double>());
}

}  // namespace

TEST_CASE("fused cross-entropy equals its ATen twin in loss and gradient, fp32 and bf16, every build",
          "[nn][loss][kernel]") {
  const std::vector<Case> cases = {
      {.batch = 2, .seq = 7, .vocab = 1000, .spread = 3, .offset = 0},  // a tail after the last full vector
      {.batch = 3, .seq = 5, .vocab = 64, .spread = 1, .offset = 0},    // whole vectors only
      {.batch = 1, .seq = 4, .vocab = 13, .spread = 2, .offset = 0},    // shorter than one vector
      {.batch = 2, .seq = 3, .vocab = 777, .spread = 8, .offset = 60},  // large logits: the shift matters
  };
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& c : cases) {
      const at::Tensor logits = logits_of(c, dtype);
      const at::Tensor labels = labels_of(c);
      const Result ref = run(logits, labels, titan::cross_entropy_sum_reference);
      for (const auto& build : titan::detail::fused_cross_entropy_builds()) {
        CAPTURE(c10::toString(dtype), c.vocab, c.offset, build);
        const Result got = run(logits, labels, [&](const at::Tensor& x, const at::Tensor& y) {
          return titan::detail::fused_cross_entropy_sum(x, y, build);
        });
        REQUIRE(got.grad.scalar_type() == dtype);
        REQUIRE(got.grad.sizes() == logits.sizes());
        // Both sum fp32 terms of the same widened values; the orders of the sums (and Sleef's exp against
        // ATen's, 1 ulp each) differ: a few fp32 ulps of the total.
        CHECK(relative(got.loss, ref.loss) < 1e-5);
        const at::Tensor diff = (got.grad.to(at::kFloat) - ref.grad.to(at::kFloat)).abs();  // (B, S, V)
        if (dtype == at::kFloat) {
          // Each gradient is 0.37 * (softmax - onehot), |.| <= 0.37: fp32 terms a few ulps apart.
          CHECK(diff.max().item<float>() < 1e-6f);
        } else {
          // Both round an fp32 gradient to bf16 once: at most one bf16 ulp (2^-8 relative) apart where the
          // fp32 values straddle a rounding boundary.
          const at::Tensor bound = ref.grad.to(at::kFloat).abs() * std::ldexp(1.0f, -8) + 1e-30f;
          CHECK(diff.le(bound).all().item<bool>());
          CHECK(diff.gt(0).to(at::kFloat).mean().item<float>() < 0.01f);
        }
        // An ignored token adds nothing and gets a zero gradient row.
        CHECK(got.grad[0][1].abs().max().item<float>() == 0.0f);
        CHECK(got.grad[c.batch - 1][c.seq - 1].abs().max().item<float>() == 0.0f);
      }
    }
  }
}

TEST_CASE("cross_entropy_sum takes the fused kernel for contiguous CPU logits and the twin otherwise",
          "[nn][loss][kernel]") {
  const Case c{.batch = 2, .seq = 6, .vocab = 100, .spread = 2, .offset = 0};
  const at::Tensor labels = labels_of(c);
  const at::Tensor logits = logits_of(c, at::kFloat).requires_grad_();  // (B, S, V)
  const at::Tensor fused = titan::cross_entropy_sum(logits, labels);
  REQUIRE(fused.grad_fn() != nullptr);
  CHECK(fused.grad_fn()->name() == "titan::FusedCrossEntropyBackward");
  CHECK(titan::detail::fused_cross_entropy_runs(logits));

  // A strided view (the vocabulary every other logit) is not the kernel's layout: the twin serves it.
  const at::Tensor wide = logits_of({.batch = 2, .seq = 6, .vocab = 200, .spread = 2, .offset = 0}, at::kFloat);
  const at::Tensor strided = wide.slice(2, 0, 200, 2).requires_grad_();  // (B, S, 100), stride 2
  CHECK_FALSE(titan::detail::fused_cross_entropy_runs(strided));
  const at::Tensor twin = titan::cross_entropy_sum(strided, labels);
  REQUIRE(twin.grad_fn() != nullptr);
  CHECK(twin.grad_fn()->name() != "titan::FusedCrossEntropyBackward");
  CHECK(relative(twin, titan::cross_entropy_sum_reference(strided.contiguous(), labels)) < 1e-6);

  // Without grad mode the loss is a plain value.
  const at::NoGradGuard no_grad;
  CHECK(titan::cross_entropy_sum(logits, labels).grad_fn() == nullptr);
}

TEST_CASE("fused cross-entropy: every label ignored gives zero, a label outside the vocabulary is refused",
          "[nn][loss][kernel]") {
  const Case c{.batch = 1, .seq = 4, .vocab = 50, .spread = 1, .offset = 0};
  const at::Tensor logits = logits_of(c, at::kBFloat16);
  const Result none = run(logits, at::full({1, 4}, titan::kIgnoreIndex, at::kLong), titan::cross_entropy_sum);
  CHECK(none.loss.item<float>() == 0.0f);
  CHECK(none.grad.abs().max().item<float>() == 0.0f);

  at::Tensor labels = at::zeros({1, 4}, at::kLong);
  labels.index_put_({0, 2}, 50);
  const std::string message = titan::test::error_of([&] { (void)titan::cross_entropy_sum(logits, labels); });
  CHECK_THAT(message,
             Catch::Contains("[0, 50)") && Catch::Contains("got 50 at token 2") && Catch::Contains("model.vocab_size"));
  labels.index_put_({0, 2}, -3);
  CHECK_THAT(titan::test::error_of([&] { (void)titan::cross_entropy_sum(logits, labels); }),
             Catch::Contains("got -3 at token 2"));
  CHECK_THAT(titan::test::error_of([&] { (void)titan::detail::fused_cross_entropy_sum(logits, labels, "avx512"); }),
             Catch::Contains("expected a build this CPU runs") && Catch::Contains("'avx512'"));
}
