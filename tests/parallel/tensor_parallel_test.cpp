// SPDX-License-Identifier: BSD-3-Clause
// Tensor, sequence and loss parallelism: parity with one rank (alone and composed with FSDP, HSDP
// and DDP; tolerances in parity_check.hpp), loss parallel against the gathered loss, memory per
// rank, the plan's printing and validation.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "../alloc_tracker.hpp"
#include "parity_check.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/parallel/tensor_parallel.hpp"

using namespace titan;
using test::check_parity;
using test::kFast;

TEST_CASE("TP 2 matches one rank for 8 steps", "[parallel][tp][parity]") {
  check_parity({.tp = 2}, {.sequence_parallel = false, .loss_parallel = false});
}

TEST_CASE("TP 2 with sequence and loss parallel matches one rank", "[parallel][tp][parity][full]") {
  check_parity({.tp = 2}, {.sequence_parallel = true, .loss_parallel = true});
}

TEST_CASE("async TP 2 (overlapped batch chunks) matches one rank", "[parallel][tp][async][parity][full]") {
  check_parity({.tp = 2}, {.async_tp = true});
}

TEST_CASE("async TP issues the next chunk's collective before computing the current one", "[parallel][tp][async]") {
  using Kind = parallel::TensorParallelEvent::Kind;
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2}, rank, store, kFast);
    const test::ParityResult r = test::train_parity(mesh, {.steps = 1, .trace = true, .async_tp = true});
    const auto events = r.applied.tensor_parallel()->trace();
    // Gathers: "issued 1" comes before "computed 0"; reduce-scatters: "issued 0" before "computed 1".
    int64_t gathers = 0, scatters = 0;
    for (size_t i = 0; i + 2 < events.size(); ++i) {
      const auto& a = events[i];
      const auto& b = events[i + 1];
      const auto& c = events[i + 2];
      if (a.kind == Kind::kIssued && a.chunk == 0 && b.kind == Kind::kIssued && b.chunk == 1 &&
          c.kind == Kind::kFinished && c.chunk == 0) {
        ++gathers;
      }
      if (a.kind == Kind::kComputed && a.chunk == 0 && b.kind == Kind::kIssued && b.chunk == 0 &&
          c.kind == Kind::kComputed && c.chunk == 1) {
        ++scatters;
      }
    }
    // Per step: embedding (RS), 2 per block x 6 (gather + inner wo/w2 RS each), output (gather).
    RANK_CHECK_INFO("gathers " << gathers, gathers >= 13);
    RANK_CHECK_INFO("scatters " << scatters, scatters >= 13);
  });
}

TEST_CASE("FSDP 2 x TP 2 matches one rank", "[parallel][tp][fsdp][parity][full]") {
  check_parity({.dp_shard = 2, .tp = 2});
}

TEST_CASE("HSDP 2x2 x TP 2 matches one rank", "[parallel][tp][hsdp][parity][full]") {
  check_parity({.dp_replicate = 2, .dp_shard = 2, .tp = 2});
}

TEST_CASE("DDP 2 x TP 2 without sequence parallel matches one rank", "[parallel][tp][ddp][parity][full]") {
  check_parity({.dp_replicate = 2, .tp = 2}, {.sequence_parallel = false});
}

TEST_CASE("loss parallel equals the gathered cross-entropy without materialising the vocabulary",
          "[parallel][tp][loss]") {
  constexpr int64_t kBatch = 2, kSeq = 16, kVocab = 1024, kTp = 2;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor full = at::randn({kBatch, kSeq, kVocab}, gen) * 3;       // (B, S, V)
  at::Tensor labels = at::randint(kVocab, {kBatch, kSeq}, gen, at::kLong);  // (B, S)
  labels.narrow(1, 0, 3).fill_(kIgnoreIndex);
  const at::Tensor whole = full.clone().requires_grad_(true);  // (B, S, V)
  int64_t gathered_largest = 0;
  at::Tensor expected;
  {
    test::TrackAllocations track;
    expected = cross_entropy_sum(whole, labels);  // ()
    expected.backward();
    gathered_largest = track.stats().largest;
  }
  const int64_t full_bytes = kBatch * kSeq * kVocab * 4;
  CHECK(gathered_largest >= full_bytes);  // the tracker sees the whole-vocabulary buffers
  dist::run_local_ranks(kTp, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = kTp}, rank, store, kFast);
    const int64_t width = kVocab / kTp;
    const at::Tensor local = full.narrow(-1, rank * width, width).clone().requires_grad_(true);  // (B, S, V/tp)
    test::TrackAllocations track;
    const at::Tensor loss = parallel::vocab_parallel_cross_entropy_sum(local, labels, mesh.group("tp"), rank * width);
    loss.backward();
    // No buffer of this rank is larger than its logits shard (fp32): the vocabulary is never gathered.
    RANK_CHECK_INFO("largest allocation " << track.stats().largest, track.stats().largest <= full_bytes / kTp);
    RANK_CHECK_INFO(
        loss.item<double>() << " vs " << expected.item<double>(),
        std::abs(loss.item<double>() - expected.item<double>()) <= 1e-5 * std::abs(expected.item<double>()));
    const at::Tensor grad_expected = whole.grad().narrow(-1, rank * width, width);
    RANK_CHECK(at::allclose(local.grad(), grad_expected, 1e-5, 1e-7));
  });
}

TEST_CASE("TP 2 keeps half of the sharded parameters per rank and vocab-sharded logits", "[parallel][tp][memory]") {
  const llama3::Llama3 meta(test::parity_args(), 32, at::TensorOptions().device(at::kMeta));
  int64_t total = 0, norms = 0;
  for (const auto& item : meta.named_parameters(/*recurse=*/true)) {
    total += item.value().numel() * 4;
    if (item.value().dim() == 1) norms += item.value().numel() * 4;  // RMSNorm weights stay whole
  }
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2}, rank, store, kFast);
    nn::manual_init_seed(3);
    llama3::Llama3 model(test::parity_args(), 32, at::TensorOptions());
    const Parallelized parallel = parallelize(model, mesh, parallel::plan(model.sharding_spec(), {}, mesh.shape()));
    model.init_weights();
    int64_t local = 0;
    for (const auto& p : model.unique_parameters()) local += p.nbytes();
    RANK_CHECK_INFO(local << " vs " << total, local == (total - norms) / 2 + norms);
    const at::Tensor logits = model.forward(at::randint(512, {2, 32}, at::kLong));  // (B, S, V/tp)
    RANK_CHECK(logits.sizes() == at::IntArrayRef({2, 32, 512 / 2}));
  });
}

TEST_CASE("the Llama 3 plan prints each path and style", "[parallel][tp][plan]") {
  const llama3::Llama3 meta(test::parity_args(), 32, at::TensorOptions().device(at::kMeta));
  const parallel::ParallelPlan plan{.tensor_parallel =
                                        parallel::tensor_parallel_plan(meta.sharding_spec(), 2, true, true)};
  const std::string text = fmt::format("{}", plan);
  CHECK(text.find("tok_embeddings: RowwiseParallel(input=Replicate(), output=Shard(1))\n") != std::string::npos);
  CHECK(text.find("layers.0.attention: PrepareModuleInput(input=Shard(1), desired=Replicate())\n") !=
        std::string::npos);
  CHECK(text.find("layers.1.attention.wo: RowwiseParallel(input=Shard(-1), output=Shard(1))\n") != std::string::npos);
  CHECK(text.find("layers.0.ffn_norm: SequenceParallel()\n") != std::string::npos);
  CHECK(text.find("output: ColwiseParallel(input=Shard(1), output=Shard(-1), loss_parallel)\n") != std::string::npos);
  // 2 (embedding, output) + norm + per block: 2 norms, 2 inputs, 3 + 1 attention, 2 + 1 feed-forward.
  CHECK(plan.tensor_parallel.styles.size() == 3 + 11 * meta.layers.size());
}

TEST_CASE("a plan is validated against the model before anything is sharded", "[parallel][tp][plan]") {
  auto error_of = [](const parallel::TensorParallelPlan& plan, int64_t degree) {
    const llama3::Llama3 meta(test::parity_args(), 32, at::TensorOptions().device(at::kMeta));
    try {
      parallel::detail::validate_tensor_parallel(meta, plan, degree);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  parallel::TensorParallelPlan unknown;
  unknown.add("layers.0.attention.wz", parallel::ColwiseParallel{});
  CHECK(error_of(unknown, 2).find("'layers.0.attention.wz'") != std::string::npos);
  parallel::TensorParallelPlan wrong_kind;
  wrong_kind.add("norm", parallel::ColwiseParallel{});
  CHECK(error_of(wrong_kind, 2).find("'norm' (ColwiseParallel) to be a linear ShardableLayer") != std::string::npos);
  parallel::TensorParallelPlan uneven;
  uneven.add("layers.0.feed_forward.w2", parallel::RowwiseParallel{});
  CHECK(error_of(uneven, 7).find("'layers.0.feed_forward.w2' input features") != std::string::npos);
  // Heads must divide: the parity model has 4 heads.
  const llama3::Llama3 meta(test::parity_args(), 32, at::TensorOptions().device(at::kMeta));
  CHECK_THROWS_WITH(parallel::tensor_parallel_plan(meta.sharding_spec(), 3, true, true),
                    Catch::Contains(fmt::format("n_heads ({})", test::parity_args().n_heads)));
}

TEST_CASE("an invalid plan leaves the model untouched", "[parallel][tp][plan]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2}, rank, store, kFast);
    llama3::Llama3 model(test::parity_args(), 32, at::TensorOptions());
    parallel::ParallelPlan plan{.data_parallel = {.units = model.sharding_spec().fsdp_units}};
    plan.tensor_parallel.add("layers.0.attention.wq", parallel::ColwiseParallel{})
        .add("layers.0.nothing", parallel::SequenceParallel{});
    bool threw = false;
    try {
      (void)parallelize(model, mesh, plan);
    } catch (const std::exception&) {
      threw = true;
    }
    RANK_CHECK(threw);
    RANK_CHECK(model.layers[0]->attention_as<nn::Attention>()->wq->weight.size(0) ==
               test::parity_args().dim);  // not sharded
    RANK_CHECK(parallel::sharded_param(model.layers[0]->attention_as<nn::Attention>()->wq->weight) == nullptr);
  });
}
