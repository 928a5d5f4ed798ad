// SPDX-License-Identifier: BSD-3-Clause
// Gated DeltaNet under context parallelism (state passing) against one process: the sequence split over cp 2 and 4
// contiguous shards, each rank continuing the previous rank's convolution inputs and delta-rule state, gives the whole
// forward's outputs, the input's gradients and the parameters' gradients (summed over the ranks, as FSDP sums them).
// Documents, some crossing rank boundaries and some starting exactly on one, and shards shorter than the
// convolution's K-1 = 3 inputs (a tail then spans two ranks). Ranks as threads on the strict backend (NCCL's rules).
//
// Tolerance 1e-5 (fp32, absolute and relative): the recurrence passes exactly (the state and inputs are copied, not
// recomputed), but each rank's chunks of the delta rule start at its own first token, so the chunked scan's sums are
// associated over other chunk boundaries than one process's: fp32 rounding (~6e-8 relative per operation) over a
// few hundred chained operations on values of order 1 stays below 1e-5. Each rank starting from a zero state instead
// of the one passed moves the ranks' outputs by 2e-4 to 1.4e-2 and fails every case.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <mutex>
#include <vector>

#include "dist/rank_test_util.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/gated_deltanet.hpp"

namespace gated_deltanet_cp_test {
namespace {

using namespace titan;

constexpr double kTol = 1e-5;
constexpr int64_t kDim = 32;

std::shared_ptr<nn::GatedDeltaNet> make_mixer() {
  nn::manual_init_seed(11);
  auto mixer = std::make_shared<nn::GatedDeltaNet>(
      kDim,
      nn::GatedDeltaNetOptions{
          .n_key_heads = 2, .n_value_heads = 4, .key_head_dim = 8, .value_head_dim = 6, .chunk_size = 4},
      at::TensorOptions());
  mixer->init_weights(nn::InitSite::current() / "mixer", /*out_std=*/0.5);
  // Projections 10x their init (std 0.2 over 32 features): q, k, v and the gate of order one, so that the state and
  // the convolution inputs a rank carries over move its outputs well above fp32 rounding.
  at::NoGradGuard no_grad;
  for (const auto& proj : {mixer->wq, mixer->wk, mixer->wv, mixer->wz}) proj->weight.mul_(10.0);
  return mixer;
}

// Document ids (B, S): row 0 with documents starting at `starts`, row 1 one document.
at::Tensor documents(int64_t seq, const std::vector<int64_t>& starts) {
  at::Tensor ids = at::zeros({2, seq}, at::kLong);
  for (const int64_t s : starts) ids[0].narrow(0, s, seq - s).add_(1);
  return ids;
}

struct Case {
  int64_t cp = 2;
  int64_t seq = 40;
  at::Tensor document_ids{};  // (B, S) or undefined
};

void check_case(const Case& c) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3 + c.cp);
  const at::Tensor x = at::randn({2, c.seq, kDim}, gen);     // (B, S, D)
  const at::Tensor dout = at::randn({2, c.seq, kDim}, gen);  // (B, S, D)

  // One process: the whole sequence.
  const auto whole = make_mixer();
  const at::Tensor rx = x.clone().requires_grad_(true);
  const at::Tensor ref = whole->forward(rx, {}, {.document_ids = c.document_ids});
  ref.backward(dout);
  REQUIRE(ref.abs().max().item<double>() > 1e-2);

  std::mutex mutex;
  std::vector<std::string> failures;
  std::vector<at::Tensor> grads;  // the parameters' gradients summed over the ranks
  dist::run_local_ranks(c.cp, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.cp = c.cp}, rank, store, test::mesh_options());
    auto sharding = std::make_shared<nn::SequenceSharding>(
        nn::SequenceSharding{.group = std::make_shared<dist::ProcessGroup>(mesh.group("cp")),
                             .layout = {.seq_len = c.seq, .degree = c.cp, .rank = rank, .load_balance = false}});
    const auto local = [&](const at::Tensor& t) { return sharding->layout.shard(t, 1); };
    const auto mixer = make_mixer();
    mixer->set_context_parallel_degree(c.cp);
    const at::Tensor lx = local(x).requires_grad_(true);
    const at::Tensor out = mixer->forward(lx, {}, {.document_ids = c.document_ids, .sharding = sharding});
    out.backward(local(dout));
    const auto close = [](const at::Tensor& a, const at::Tensor& b) { return at::allclose(a, b, kTol, kTol); };
    std::lock_guard lock(mutex);
    if (!close(out, local(ref))) {
      failures.push_back(fmt::format("rank {}: output off by {}", rank, (out - local(ref)).abs().max().item<double>()));
    }
    if (!close(lx.grad(), local(rx.grad()))) failures.push_back(fmt::format("rank {}: input gradient", rank));
    const auto params = mixer->parameters();
    if (grads.empty()) {
      for (const at::Tensor& p : params) grads.push_back(at::zeros_like(p));
    }
    for (size_t i = 0; i < params.size(); ++i) grads[i] += params[i].grad();
  });
  INFO(fmt::format("cp {} seq {} documents {}", c.cp, c.seq, c.document_ids.defined()));
  CHECK(failures == std::vector<std::string>{});
  const auto named = whole->named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    const at::Tensor& expected = named[i].value().grad();
    INFO(named[i].key() << " max diff " << (grads[i] - expected).abs().max().item<double>());
    CHECK(expected.abs().max().item<double>() > 1e-6);  // every parameter has a gradient (the decay's are ~1e-5)
    CHECK(at::allclose(grads[i], expected, kTol, kTol));
  }
}

}  // namespace

TEST_CASE("Gated DeltaNet under context parallelism equals one process: outputs and gradients", "[cp][gated_delta]") {
  const int64_t cp = GENERATE(2, 4);
  // 40 tokens: 20 or 10 per rank (chunks of 4 that start at each rank's first token). Row 0's documents start at 7
  // (inside rank 0), 10 (on cp 4's boundary), 17 (crossing cp 2's boundary at 20 and cp 4's at 20 and 30).
  check_case({.cp = cp, .seq = 40});
  check_case({.cp = cp, .seq = 40, .document_ids = documents(40, {7, 10, 17})});
  // 8 tokens at cp 4: 2 per rank, fewer than the convolution's 3 carried inputs; a document starting on rank 2's first
  // token and one starting inside rank 1.
  if (cp == 4) check_case({.cp = 4, .seq = 8, .document_ids = documents(8, {3, 4})});
}

TEST_CASE("Gated DeltaNet refuses a load-balanced context-parallel split", "[cp][gated_delta]") {
  const auto mixer = make_mixer();
  mixer->set_context_parallel_degree(2);
  auto sharding = std::make_shared<nn::SequenceSharding>(nn::SequenceSharding{
      .group = std::make_shared<dist::ProcessGroup>(dist::ProcessGroup::unconnected("cp", 0, 2, {0, 1})),
      .layout = {.seq_len = 8, .degree = 2, .rank = 0, .load_balance = true}});
  CHECK_THROWS_WITH(mixer->forward(at::randn({1, 4, kDim}), {}, {.sharding = sharding}),
                    Catch::Contains("parallelism.context_parallel_load_balancer None"));
}

}  // namespace gated_deltanet_cp_test
