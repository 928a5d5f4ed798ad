// SPDX-License-Identifier: BSD-3-Clause
// Context-parallel attention against one-device SDPA: every split (cp 2, 3, 4; headtail or
// contiguous chunks), both K/V exchanges and Ulysses (cp 2 and 4: it needs the heads divisible by cp),
// causal and document-masked, GQA and not. Outputs and the gradients of q, k and v agree within 1e-5
// (fp32): the blocks' partial results are merged through their log-sum-exp, which reorders the softmax
// sums (measured max difference ~1e-6); Ulysses runs the one-device kernel on whole sequences of fewer
// heads, so only the kernel's own blocking differs.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <mutex>

#include "dist/rank_test_util.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/sequence_attention.hpp"

namespace titan::test {
namespace {

constexpr double kTol = 1e-5;
// On the strict backend: both K/V exchanges held to NCCL's rules (tests/dist/nccl_rules_test.cpp).
const dist::MeshOptions kQuick = mesh_options();

struct AttentionCase {
  int64_t cp = 2;
  bool headtail = true;
  bool documents = false;
  bool gqa = false;
  CpRotateMethod rotate = CpRotateMethod::allgather;
};

// Documents of random lengths (1..S/2 tokens), numbered from 0 in each row.
at::Tensor random_documents(int64_t batch, int64_t seq, at::Generator& gen) {
  const at::Tensor starts = at::rand({batch, seq}, gen) < 0.15;  // (B, S)
  starts.select(1, 0).fill_(true);
  return starts.to(at::kLong).cumsum(1) - 1;
}

bool close(const at::Tensor& a, const at::Tensor& b) { return at::allclose(a, b, kTol, kTol); }

void check_case(const AttentionCase& c) {
  const int64_t B = 2, H = 4, KVH = c.gqa ? 2 : 4, HD = 16;
  const int64_t S = 4 * (c.headtail ? 2 * c.cp : c.cp);  // 4 tokens per chunk
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7 + c.cp);
  const at::Tensor q = at::randn({B, H, S, HD}, gen);                                // (B, H, S, HD)
  const at::Tensor k = at::randn({B, KVH, S, HD}, gen);                              // (B, KVH, S, HD)
  const at::Tensor v = at::randn({B, KVH, S, HD}, gen);                              // (B, KVH, S, HD)
  const at::Tensor dout = at::randn({B, H, S, HD}, gen);                             // (B, H, S, HD)
  const at::Tensor docs = c.documents ? random_documents(B, S, gen) : at::Tensor();  // (B, S)

  // The reference: the whole sequence on one device.
  const at::Tensor rq = q.clone().requires_grad_(true), rk = k.clone().requires_grad_(true),
                   rv = v.clone().requires_grad_(true);
  const at::Tensor ref = nn::local_causal_attention(rq, rk, rv, docs);
  ref.backward(dout);

  std::mutex mutex;
  std::vector<std::string> failures;
  dist::run_local_ranks(c.cp, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.cp = c.cp}, rank, store, kQuick);
    const nn::SequenceSharding sharding{
        .group = std::make_shared<dist::ProcessGroup>(mesh.group("cp")),
        .layout = {.seq_len = S, .degree = c.cp, .rank = rank, .load_balance = c.headtail},
        .rotate = c.rotate};
    const auto local = [&](const at::Tensor& t) { return sharding.layout.shard(t, 2); };
    const at::Tensor lq = local(q).requires_grad_(true), lk = local(k).requires_grad_(true),
                     lv = local(v).requires_grad_(true);
    const at::Tensor out = nn::context_parallel_attention(lq, lk, lv, sharding, docs);
    out.backward(local(dout));
    const std::pair<const char*, bool> checks[] = {{"output", close(out, local(ref))},
                                                   {"dq", close(lq.grad(), local(rq.grad()))},
                                                   {"dk", close(lk.grad(), local(rk.grad()))},
                                                   {"dv", close(lv.grad(), local(rv.grad()))}};
    std::lock_guard lock(mutex);
    for (const auto& [what, ok] : checks) {
      if (!ok) failures.push_back(fmt::format("rank {}: {}", rank, what));
    }
  });
  INFO(fmt::format("cp {} headtail {} documents {} gqa {} rotate {}", c.cp, c.headtail, c.documents, c.gqa, c.rotate));
  CHECK(failures == std::vector<std::string>{});
}

}  // namespace

TEST_CASE("context-parallel attention equals one-device SDPA: outputs and gradients", "[cp][attention]") {
  const int64_t cp = GENERATE(2, 3, 4);
  const bool headtail = GENERATE(true, false);
  const bool documents = GENERATE(false, true);
  const CpRotateMethod rotate = GENERATE(CpRotateMethod::allgather, CpRotateMethod::alltoall);
  const bool gqa = GENERATE(false, true);
  check_case({.cp = cp, .headtail = headtail, .documents = documents, .gqa = gqa, .rotate = rotate});
}

TEST_CASE("Ulysses attention equals one-device SDPA: outputs and gradients", "[cp][attention][ulysses]") {
  const int64_t cp = GENERATE(2, 4);  // 4 heads; with GQA at cp 4 the 2 KV heads are repeated first
  const bool headtail = GENERATE(true, false);
  const bool documents = GENERATE(false, true);
  const bool gqa = GENERATE(false, true);
  check_case({.cp = cp, .headtail = headtail, .documents = documents, .gqa = gqa, .rotate = CpRotateMethod::ulysses});
}

TEST_CASE("Ulysses attention with heads that cp does not divide is a clear error", "[cp][attention][ulysses]") {
  dist::run_local_ranks(3, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.cp = 3}, rank, store, kQuick);
    const nn::SequenceSharding sharding{.group = std::make_shared<dist::ProcessGroup>(mesh.group("cp")),
                                        .layout = {.seq_len = 12, .degree = 3, .rank = rank, .load_balance = false},
                                        .rotate = CpRotateMethod::ulysses};
    const at::Tensor x = at::zeros({1, 4, 4, 8});  // (B, H, S/cp, HD): 4 heads over 3 ranks
    const std::string error = error_of([&] { (void)nn::context_parallel_attention(x, x, x, sharding); });
    RANK_CHECK_INFO(error, error.find("query heads (4 = n_heads / parallelism.tensor_parallel_degree) divisible by "
                                      "parallelism.context_parallel_degree 3") != std::string::npos);
  });
}

TEST_CASE("the headtail layout gives rank r chunks r and 2c-1-r", "[cp][attention]") {
  const nn::SequenceLayout layout{.seq_len = 16, .degree = 2, .rank = 0, .load_balance = true};
  CHECK(layout.token_index(at::kCPU).equal(at::tensor({0, 1, 2, 3, 12, 13, 14, 15}, at::kLong)));
  const nn::SequenceLayout second{.seq_len = 16, .degree = 2, .rank = 1, .load_balance = false};
  CHECK(second.token_index(at::kCPU).equal(at::arange(8, 16, at::kLong)));
  const at::Tensor x = at::arange(16).view({1, 16});
  CHECK(layout.shard(x, 1).equal(at::tensor({0, 1, 2, 3, 12, 13, 14, 15}).view({1, 8})));
}

TEST_CASE("a sequence that does not split into 2 x cp chunks is refused, naming the divisor", "[cp][attention]") {
  const nn::SequenceLayout layout{.seq_len = 20, .degree = 3, .rank = 0, .load_balance = true};
  const std::string error = error_of([&] { layout.check("titan::test"); });
  CHECK(error.find("expected training.seq_len divisible by 6") != std::string::npos);
  CHECK(error.find("headtail") != std::string::npos);
}

TEST_CASE("document-masked attention on one device equals per-document attention", "[cp][attention]") {
  // Two documents of 5 and 3 tokens in one row: each attends only to itself.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor q = at::randn({1, 2, 8, 8}, gen), k = at::randn({1, 2, 8, 8}, gen), v = at::randn({1, 2, 8, 8}, gen);
  const at::Tensor docs = at::tensor({0, 0, 0, 0, 0, 1, 1, 1}, at::kLong).view({1, 8});
  const at::Tensor out = nn::local_causal_attention(q, k, v, docs);
  const auto part = [](const at::Tensor& t, int64_t b, int64_t n) { return t.narrow(2, b, n); };
  CHECK(close(part(out, 0, 5), nn::local_causal_attention(part(q, 0, 5), part(k, 0, 5), part(v, 0, 5))));
  CHECK(close(part(out, 5, 3), nn::local_causal_attention(part(q, 5, 3), part(k, 5, 3), part(v, 5, 3))));
}

}  // namespace titan::test
