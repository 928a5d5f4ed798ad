// SPDX-License-Identifier: BSD-3-Clause
// The gated delta rule's two forms against the paper's equations, run token by token as written (S as (dv, dk),
// S_t = S_{t-1} a_t (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, o_t = S_t q_t) in fp64: the chunked form (several
// chunks and a ragged last one, an initial state, grouped value heads) and the recurrent form give its outputs and
// final state; with document ids, each document as if run alone; the chunked form's gradients equal the recurrent
// form's. Then the layer around it: the causal convolution with documents and with a history, and
// nn::GatedDeltaNet decoding through a KV cache (prefill, then one token per step, left padding) giving the logits
// of one whole forward.
//
// Tolerances: the fp64 comparisons differ by rounding only (~1e-16 per operation over at most a few hundred chained
// operations on values of order 1), so 1e-10 leaves a wide margin while a wrong decay, step or mask is off by
// 1e-2 or more. The layer runs in fp32: the chunked and recurrent forms then reorder fp32 sums (~6e-8 relative
// each) over 24 tokens, values of order 1: 1e-5.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

#include "test_util.hpp"
#include "titan/nn/gated_delta_rule.hpp"
#include "titan/nn/gated_deltanet.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/kv_cache.hpp"

namespace gated_delta_rule_test {
namespace {

using titan::nn::DeltaRuleInputs;
using titan::nn::DeltaRuleOutput;

constexpr double kFp64Tolerance = 1e-10;
constexpr double kFp32Tolerance = 1e-5;

struct Sizes {
  int64_t batch = 2;
  int64_t seq = 37;  // chunks of 8: four whole ones and a ragged fifth
  int64_t key_heads = 2;
  int64_t value_heads = 4;
  int64_t dk = 5;
  int64_t dv = 3;
};

// Random inputs as the layer makes them: q and k unit vectors (q scaled), decays in (0, 1), steps in (0, 1).
DeltaRuleInputs random_inputs(const Sizes& s, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const auto randn = [&](at::IntArrayRef shape) { return at::randn(shape, gen, opts); };
  return {
      .q = titan::nn::l2_normalize(randn({s.batch, s.seq, s.key_heads, s.dk})) / std::sqrt(static_cast<double>(s.dk)),
      .k = titan::nn::l2_normalize(randn({s.batch, s.seq, s.key_heads, s.dk})),
      .v = randn({s.batch, s.seq, s.value_heads, s.dv}),
      .g = -at::rand({s.batch, s.seq, s.value_heads}, gen, opts) * 0.5,
      .beta = at::rand({s.batch, s.seq, s.value_heads}, gen, opts),
      .initial_state = randn({s.batch, s.value_heads, s.dk, s.dv}) * 0.3};
}

// The paper's recurrence, token by token and head by head, in its own orientation (state (dv, dk)). A new document
// starts from an empty state.
DeltaRuleOutput paper_recurrence(const DeltaRuleInputs& in) {
  const int64_t B = in.v.size(0), S = in.v.size(1), H = in.v.size(2), dk = in.q.size(3);
  const int64_t group = H / in.q.size(2);
  at::Tensor out = at::zeros_like(in.v);                      // (B, S, H, dv)
  at::Tensor final_state = at::zeros_like(in.initial_state);  // (B, H, dk, dv)
  const at::Tensor eye = at::eye(dk, in.v.options());         // (dk, dk)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      at::Tensor state = in.initial_state[b][h].t().clone();  // (dv, dk)
      for (int64_t t = 0; t < S; ++t) {
        if (in.document_ids.defined() && t > 0 &&
            in.document_ids[b][t].item<int64_t>() != in.document_ids[b][t - 1].item<int64_t>()) {
          state.zero_();
        }
        const at::Tensor q = in.q[b][t][h / group], k = in.k[b][t][h / group], v = in.v[b][t][h];  // (dk), (dv)
        const at::Tensor a = in.g[b][t][h].exp(), beta = in.beta[b][t][h];
        state = state.matmul(a * (eye - beta * at::outer(k, k))) + beta * at::outer(v, k);
        out[b][t][h] = state.matmul(q);
      }
      final_state[b][h] = state.t();
    }
  }
  return {out, final_state};
}

void check_close(const DeltaRuleOutput& got, const DeltaRuleOutput& want, double tolerance) {
  INFO("output max diff " << (got.out - want.out).abs().max().item<double>() << ", state max diff "
                          << (got.state - want.state).abs().max().item<double>());
  CHECK(got.out.sizes() == want.out.sizes());
  CHECK(at::allclose(got.out, want.out, 0, tolerance));
  CHECK(at::allclose(got.state, want.state, 0, tolerance));
}

}  // namespace

TEST_CASE("the chunked and recurrent gated delta rule give the paper's per-token recurrence", "[nn][gated_delta]") {
  const DeltaRuleInputs in = random_inputs({}, 1);
  const DeltaRuleOutput want = paper_recurrence(in);
  CHECK(want.out.abs().max().item<double>() > 0.1);  // the comparison sees real values
  check_close(titan::nn::chunk_gated_delta_rule(in, /*chunk_size=*/8), want, kFp64Tolerance);
  check_close(titan::nn::chunk_gated_delta_rule(in, /*chunk_size=*/64), want, kFp64Tolerance);  // one ragged chunk
  check_close(titan::nn::recurrent_gated_delta_rule(in), want, kFp64Tolerance);
}

TEST_CASE("the gated delta rule restarts at each document as if it ran alone", "[nn][gated_delta]") {
  DeltaRuleInputs in = random_inputs({}, 2);
  // Row 0: documents of 5, 11 (a chunk boundary inside), 3 (a whole chunk's start at 16) and 18 tokens; row 1 one.
  at::Tensor ids = at::zeros({2, 37}, at::kLong);  // (B, S)
  ids[0].narrow(0, 5, 11).fill_(1);
  ids[0].narrow(0, 16, 3).fill_(2);
  ids[0].narrow(0, 19, 18).fill_(7);
  in.document_ids = ids;
  const DeltaRuleOutput want = paper_recurrence(in);
  check_close(titan::nn::chunk_gated_delta_rule(in, 8), want, kFp64Tolerance);
  check_close(titan::nn::recurrent_gated_delta_rule(in), want, kFp64Tolerance);
  // A document alone: the last one of row 0 from an empty state.
  DeltaRuleInputs last{.q = in.q.narrow(1, 19, 18).narrow(0, 0, 1),
                       .k = in.k.narrow(1, 19, 18).narrow(0, 0, 1),
                       .v = in.v.narrow(1, 19, 18).narrow(0, 0, 1),
                       .g = in.g.narrow(1, 19, 18).narrow(0, 0, 1),
                       .beta = in.beta.narrow(1, 19, 18).narrow(0, 0, 1)};
  const DeltaRuleOutput alone = titan::nn::chunk_gated_delta_rule(last, 8);
  CHECK(at::allclose(want.out[0].narrow(0, 19, 18), alone.out[0], 0, kFp64Tolerance));
  CHECK(at::allclose(want.state.narrow(0, 0, 1), alone.state, 0, kFp64Tolerance));
}

TEST_CASE("the chunked gated delta rule's gradients equal the recurrent form's", "[nn][gated_delta]") {
  DeltaRuleInputs in = random_inputs({.seq = 19}, 3);
  in.document_ids = (at::arange(19, at::kLong) >= 11).to(at::kLong).unsqueeze(0).expand({2, 19}).contiguous();
  std::vector<at::Tensor> leaves{in.q, in.k, in.v, in.g, in.beta, in.initial_state};
  for (at::Tensor& t : leaves) t = t.detach().requires_grad_(true);
  const DeltaRuleInputs with_grad{.q = leaves[0],
                                  .k = leaves[1],
                                  .v = leaves[2],
                                  .g = leaves[3],
                                  .beta = leaves[4],
                                  .initial_state = leaves[5],
                                  .document_ids = in.document_ids};
  const at::Tensor weight_out = at::randn({2, 19, 4, 3}, at::kDouble);  // a loss that weighs every output
  const at::Tensor weight_state = at::randn({2, 4, 5, 3}, at::kDouble);
  const auto gradients = [&](const DeltaRuleOutput& r) {
    return torch::autograd::grad({(r.out * weight_out).sum() + (r.state * weight_state).sum()}, leaves);
  };
  const auto chunked = gradients(titan::nn::chunk_gated_delta_rule(with_grad, 8));
  const auto recurrent = gradients(titan::nn::recurrent_gated_delta_rule(with_grad));
  for (size_t i = 0; i < leaves.size(); ++i) {
    INFO("input " << i << " max diff " << (chunked[i] - recurrent[i]).abs().max().item<double>());
    CHECK(chunked[i].isfinite().all().item<bool>());
    CHECK(recurrent[i].abs().max().item<double>() > 1e-3);
    CHECK(at::allclose(chunked[i], recurrent[i], 0, kFp64Tolerance));
  }
}

TEST_CASE("the causal convolution restarts at documents and continues from a history", "[nn][gated_delta]") {
  titan::nn::CausalConv1d conv(6, 4, at::TensorOptions().dtype(at::kDouble));
  {
    at::NoGradGuard no_grad;
    conv.weight.copy_(at::randn({6, 4}, at::kDouble));
  }
  const at::Tensor x = at::randn({2, 10, 6}, at::kDouble);  // (B, S, C)
  at::Tensor ids = at::zeros({2, 10}, at::kLong);
  ids[0].narrow(0, 3, 7).fill_(4);
  const at::Tensor with_documents = conv.forward(x, {}, ids);
  // Row 0: its two documents apart; row 1: one document, the plain convolution.
  CHECK(at::allclose(with_documents[0].narrow(0, 0, 3), conv.forward(x.narrow(0, 0, 1).narrow(1, 0, 3))[0]));
  CHECK(at::allclose(with_documents[0].narrow(0, 3, 7), conv.forward(x.narrow(0, 0, 1).narrow(1, 3, 7))[0]));
  CHECK(at::allclose(with_documents[1], conv.forward(x)[1]));
  // The last 6 tokens after the first 4 given as history (the last K-1 = 3 of them).
  CHECK(at::allclose(conv.forward(x.narrow(1, 4, 6), x.narrow(1, 1, 3)), conv.forward(x).narrow(1, 4, 6)));
}

TEST_CASE("Gated DeltaNet decoding through a KV cache gives the whole forward's outputs", "[nn][gated_delta]") {
  titan::nn::manual_init_seed(5);
  titan::nn::GatedDeltaNet mixer(
      32, {.n_key_heads = 2, .n_value_heads = 4, .key_head_dim = 8, .value_head_dim = 6, .chunk_size = 8},
      at::TensorOptions());
  mixer.init_weights(titan::nn::InitSite::current() / "mixer", 0.02);
  at::NoGradGuard no_grad;
  const at::Tensor x = at::randn({2, 24, 32});  // (B, S, D)
  const at::Tensor whole = mixer.forward(x, {}, {});
  CHECK(whole.abs().max().item<double>() > 1e-3);
  // Row 1 is padded by 5 columns on the left: the cache's rows then start at columns 0 and 5.
  const at::Tensor pad = at::tensor({0, 5}, at::kLong);
  at::Tensor padded = at::cat({x, at::zeros({2, 5, 32})}, 1);  // (B, S+5, D)
  padded[1] = at::cat({at::full({5, 32}, 3.0), x[1]});         // garbage in the padding: it must not count
  titan::nn::KVCache cache(1, 29, pad);
  std::vector<at::Tensor> steps{mixer.forward_cached(padded.narrow(1, 0, 10), {}, {}, {}, cache, 0)};  // prefill
  cache.advance(10);
  for (int64_t t = 10; t < 29; ++t) {
    steps.push_back(mixer.forward_cached(padded.narrow(1, t, 1), {}, {}, {}, cache, 0));
    cache.advance(1);
  }
  const at::Tensor decoded = at::cat(steps, 1);  // (B, S+5, D)
  INFO("row 0 max diff " << (decoded[0].narrow(0, 0, 24) - whole[0]).abs().max().item<double>());
  CHECK(at::allclose(decoded[0].narrow(0, 0, 24), whole[0], 0, kFp32Tolerance));
  CHECK(at::allclose(decoded[1].narrow(0, 5, 24), whole[1], 0, kFp32Tolerance));
}

}  // namespace gated_delta_rule_test
