// SPDX-License-Identifier: BSD-3-Clause
// Attention with per-head sinks and a sliding window (nn/sink_attention.hpp) against the definition
// written out: scores q k^T / sqrt(HD), keys outside the window or the document masked, one sink logit per
// head appended to every row, softmax, the sink column dropped. Values and the gradients of q, k, v and
// the sinks, with grouped-query heads; the KV-cache form against the training form; a biased Linear; the
// refusals (context parallelism other than Ulysses, tensor parallelism of a bias the layer does not declare).
// Under Ulysses CP 2 (whole sequences of half the heads on each rank) the same values and gradients, the sinks'
// gradient summed over the ranks. Tolerances: fp32 with the
// flash kernel's blockwise softmax against one softmax over the row, ~1e-7 relative per sum; 1e-5.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <mutex>

#include "dist/rank_test_util.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/layers.hpp"
#include "titan/nn/sink_attention.hpp"
#include "titan/parallel/parallelize.hpp"

namespace titan::test {
namespace {

constexpr int64_t B = 2, H = 4, KVH = 2, S = 10, HD = 8;

// (B or 1, S, S) true where query i sees key j.
at::Tensor allowed_keys(int64_t window, const at::Tensor& docs) {
  const at::Tensor i = at::arange(S).unsqueeze(1), j = at::arange(S).unsqueeze(0);
  at::Tensor ok = j.le(i);
  if (window > 0) ok = ok.logical_and(i - j < window);
  ok = ok.unsqueeze(0);
  if (docs.defined()) ok = ok.logical_and(docs.unsqueeze(2) == docs.unsqueeze(1));
  return ok;
}

at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& sinks,
                     int64_t window, const at::Tensor& docs) {
  const at::Tensor keys = k.repeat_interleave(H / KVH, 1), values = v.repeat_interleave(H / KVH, 1);
  at::Tensor scores = at::matmul(q, keys.transpose(-2, -1)) / std::sqrt(static_cast<double>(HD));  // (B, H, S, S)
  scores = scores.masked_fill(allowed_keys(window, docs).unsqueeze(1).logical_not(),
                              -std::numeric_limits<double>::infinity());
  at::Tensor sink = sinks.defined() ? sinks.view({1, H, 1, 1}).expand({B, H, S, 1})
                                    : at::full({B, H, S, 1}, -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(at::cat({scores, sink}, -1), -1).narrow(-1, 0, S), values);
}

struct Inputs {
  at::Tensor q, k, v, sinks;
};

Inputs inputs(bool with_sinks) {
  at::manual_seed(3);
  return {at::randn({B, H, S, HD}).requires_grad_(true), at::randn({B, KVH, S, HD}).requires_grad_(true),
          at::randn({B, KVH, S, HD}).requires_grad_(true),
          with_sinks ? (at::randn({H}) * 2).requires_grad_(true) : at::Tensor()};
}

}  // namespace

TEST_CASE("sink attention equals softmax with a sink column, values and gradients", "[nn][attention][sinks]") {
  const auto [window, with_sinks, with_docs] = GENERATE(table<int64_t, bool, bool>(
      {{0, true, false}, {3, true, false}, {4, true, true}, {3, false, false}, {0, true, true}}));
  INFO("window " << window << " sinks " << with_sinks << " documents " << with_docs);
  const Inputs in = inputs(with_sinks);
  const at::Tensor docs =
      with_docs ? at::tensor({0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2}, at::kLong).view({B, S})
                : at::Tensor();
  const at::Tensor got = nn::sink_attention(in.q, in.k, in.v, in.sinks, window, {.document_ids = docs});
  const at::Tensor want = reference(in.q, in.k, in.v, in.sinks, window, docs);
  CHECK((got - want).abs().max().item<double>() < 1e-5);
  std::vector<at::Tensor> leaves{in.q, in.k, in.v};
  if (with_sinks) leaves.push_back(in.sinks);
  const at::Tensor dy = at::randn_like(got);
  const auto g = torch::autograd::grad({got}, leaves, {dy});
  const auto w = torch::autograd::grad({want}, leaves, {dy});
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("gradient " << i << " max abs diff " << (g[i] - w[i]).abs().max().item<double>());
    CHECK(at::allclose(g[i], w[i], 1e-5, 1e-5));
  }
  if (with_sinks) CHECK(g[3].abs().min().item<double>() > 0);  // every head's sink learns
}

TEST_CASE("sink attention over a KV cache equals the training form", "[nn][attention][sinks]") {
  const Inputs in = inputs(true);
  at::NoGradGuard no_grad;
  for (const int64_t window : {0, 3}) {
    INFO("window " << window);
    const at::Tensor whole = nn::sink_attention(in.q, in.k, in.v, in.sinks, window);  // (B, H, S, HD)
    const at::Tensor causal = at::ones({S, S}, at::kBool).tril().view({1, 1, S, S});
    const at::Tensor all = nn::cached_sink_attention(in.q, in.k, in.v, causal, in.sinks, window);
    CHECK((all - whole).abs().max().item<double>() < 1e-5);
    // The last query alone against every cached column.
    const at::Tensor last = nn::cached_sink_attention(in.q.narrow(2, S - 1, 1), in.k, in.v,
                                                      at::ones({1, 1, 1, S}, at::kBool), in.sinks, window);
    CHECK((last - whole.narrow(2, S - 1, 1)).abs().max().item<double>() < 1e-5);
  }
}

TEST_CASE("a biased Linear adds its bias, and tensor parallelism refuses a bias its layer does not hand over",
          "[nn][layers]") {
  nn::Linear linear(3, 2, at::TensorOptions(), /*bias=*/true);
  {
    at::NoGradGuard no_grad;
    linear.weight.copy_(at::tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}).view({2, 3}));
    linear.bias.copy_(at::tensor({0.5f, -1.f}));
  }
  const at::Tensor y = linear.forward(at::tensor({1.f, 1.f, 1.f}).view({1, 3}));
  CHECK(at::equal(y, at::tensor({6.5f, 14.f}).view({1, 2})));
  CHECK(linear.named_parameters().contains("bias"));
  CHECK_FALSE(nn::Linear(3, 2, at::TensorOptions()).named_parameters().contains("bias"));
  // A projection of one's own whose bias the style cannot see would add it once per rank before a rowwise sum:
  // refused before anything is sharded (nn::Linear hands its bias over; tests/parallel/tp_user_layers_test.cpp).
  struct OwnProjection : torch::nn::Module, parallel::ShardableLayer {
    at::Tensor weight = register_parameter("weight", at::zeros({4, 4}));  // (out, in)
    at::Tensor bias = register_parameter("bias", at::zeros({4}));         // (out), not declared to the style
    Role shardable_role() const override { return Role::kLinear; }
    at::Tensor& shardable_weight() override { return weight; }
  };
  struct OneProjection : torch::nn::Module {
    std::shared_ptr<OwnProjection> proj = register_module("proj", std::make_shared<OwnProjection>());
  };
  std::vector<std::string> errors(2);
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2}, rank, store, mesh_options());
    OneProjection model;
    parallel::ParallelPlan plan;
    plan.tensor_parallel.add("proj", parallel::RowwiseParallel{});
    errors[static_cast<size_t>(rank)] = error_of([&] { (void)parallelize(model, mesh, plan); });
  });
  CHECK_THAT(errors[0], Catch::Contains("expected 'proj' (Colwise/RowwiseParallel) to hand its bias to the style") &&
                            Catch::Contains("shardable_bias"));
}

TEST_CASE("sink attention under Ulysses CP 2 equals one device: window, documents, per-head sinks",
          "[nn][attention][sinks][cp][ulysses]") {
  const bool headtail = GENERATE(true, false);
  const bool with_docs = GENERATE(false, true);
  INFO("headtail " << headtail << " documents " << with_docs);
  constexpr int64_t kCp = 2, kSeq = 16, kWindow = 3;  // the window crosses every chunk boundary
  at::manual_seed(5);
  const at::Tensor q = at::randn({B, H, kSeq, HD}), k = at::randn({B, KVH, kSeq, HD}),
                   v = at::randn({B, KVH, kSeq, HD}), sinks = at::randn({H}) * 2, dy = at::randn({B, H, kSeq, HD});
  const at::Tensor docs = with_docs ? (at::arange(kSeq).unsqueeze(0) >= at::tensor({5, 11}).unsqueeze(1)).to(at::kLong)
                                    : at::Tensor();  // (B, S): two documents per row, split at 5 and 11
  std::vector<at::Tensor> want{q.clone().requires_grad_(true), k.clone().requires_grad_(true),
                               v.clone().requires_grad_(true), sinks.clone().requires_grad_(true)};
  const at::Tensor ref = nn::sink_attention(want[0], want[1], want[2], want[3], kWindow, {.document_ids = docs});
  const auto ref_grads = torch::autograd::grad({ref}, want, {dy});
  std::mutex mutex;
  std::vector<std::string> failures;
  at::Tensor sink_grad = at::zeros({H});  // summed over the ranks: each holds its heads' share
  titan::dist::run_local_ranks(kCp, [&](int64_t rank, const titan::dist::Store& store) {
    const titan::dist::Mesh mesh({.cp = kCp}, rank, store, mesh_options());
    auto sharding = std::make_shared<nn::SequenceSharding>(
        nn::SequenceSharding{.group = std::make_shared<titan::dist::ProcessGroup>(mesh.group("cp")),
                             .layout = {.seq_len = kSeq, .degree = kCp, .rank = rank, .load_balance = headtail},
                             .rotate = CpRotateMethod::ulysses});
    const auto local = [&](const at::Tensor& t) { return sharding->layout.shard(t, 2); };
    std::vector<at::Tensor> leaves{local(q).requires_grad_(true), local(k).requires_grad_(true),
                                   local(v).requires_grad_(true), sinks.clone().requires_grad_(true)};
    const at::Tensor out = nn::sink_attention(leaves[0], leaves[1], leaves[2], leaves[3], kWindow,
                                              {.document_ids = docs, .sharding = sharding});
    const auto grads = torch::autograd::grad({out}, leaves, {local(dy)});
    const std::pair<const char*, bool> checks[] = {{"output", at::allclose(out, local(ref), 1e-5, 1e-5)},
                                                   {"dq", at::allclose(grads[0], local(ref_grads[0]), 1e-5, 1e-5)},
                                                   {"dk", at::allclose(grads[1], local(ref_grads[1]), 1e-5, 1e-5)},
                                                   {"dv", at::allclose(grads[2], local(ref_grads[2]), 1e-5, 1e-5)}};
    std::lock_guard lock(mutex);
    sink_grad += grads[3];
    for (const auto& [what, ok] : checks) {
      if (!ok) failures.push_back(fmt::format("rank {}: {}", rank, what));
    }
  });
  CHECK(failures == std::vector<std::string>{});
  CHECK(at::allclose(sink_grad, ref_grads[3], 1e-5, 1e-5));
  CHECK(ref_grads[3].abs().min().item<double>() > 0);  // every head's sink learns, on one rank or the other
}

TEST_CASE("sink attention refuses a context-parallel split, naming the fix", "[nn][attention][sinks][errors]") {
  const Inputs in = inputs(true);
  auto sharding = std::make_shared<nn::SequenceSharding>();
  sharding->layout = {.seq_len = 2 * S, .degree = 2, .rank = 0};
  CHECK_THROWS_WITH(nn::sink_attention(in.q, in.k, in.v, in.sinks, 3, {.sharding = sharding}),
                    Catch::Contains("[titan::nn::sink_attention] expected whole sequences") &&
                        Catch::Contains("context_parallel_rotate_method ulysses") &&
                        Catch::Contains("parallelism.context_parallel_degree 1"));
  CHECK_THROWS_WITH(nn::sink_attention(in.q, in.k, in.v, at::zeros({3}), 3),
                    Catch::Contains("expected one sink per query head (4)"));
}

}  // namespace titan::test
