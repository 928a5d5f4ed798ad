// SPDX-License-Identifier: BSD-3-Clause
// FSDP / HSDP / DDP against one rank (tolerances: tests/parallel/parity_check.hpp), memory, overlap.
#include <ATen/ATen.h>

#include <mutex>

#include "parity_check.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/parallel/data_parallel.hpp"
#include "titan/parallel/planner.hpp"

using namespace titan;

namespace {

using test::check_parity;
using test::kFast;
using test::single_rank;

}  // namespace

TEST_CASE("FSDP 2 matches one rank for 8 steps", "[parallel][fsdp][parity]") { check_parity({.dp_shard = 2}); }

TEST_CASE("FSDP 4 with reshard always matches one rank", "[parallel][fsdp][parity][full]") {
  check_parity({.dp_shard = 4}, {.reshard = ReshardAfterForward::always});
}

TEST_CASE("HSDP 2x2 matches one rank", "[parallel][hsdp][parity]") { check_parity({.dp_replicate = 2, .dp_shard = 2}); }

TEST_CASE("DDP 2 with 2 accumulation microbatches matches one rank", "[parallel][ddp][parity][full]") {
  check_parity({.dp_replicate = 2}, {.accumulation = 2});
}

// 3 ranks: debugmodel's 256-row weights split 86/86/84 rows, so every gather and reduce goes
// through the padded path.
TEST_CASE("FSDP 3 with padded shards matches one rank", "[parallel][fsdp][parity][full]") {
  check_parity({.dp_shard = 3}, {.global_batch = 6});
}

TEST_CASE("FSDP 3 with flat collectives matches one rank", "[parallel][fsdp][parity][full]") {
  check_parity({.dp_shard = 3}, {.global_batch = 6, .collectives = parallel::DataParallelCollectives::flat});
}

TEST_CASE("DDP 2 with flat collectives matches one rank", "[parallel][ddp][parity]") {
  check_parity({.dp_replicate = 2}, {.collectives = parallel::DataParallelCollectives::flat});
}

TEST_CASE("FSDP initial weights equal the single-rank ones from the seed alone", "[parallel][fsdp][init]") {
  nn::manual_init_seed(42);
  llama3::Llama3 reference(test::parity_args(), 64, at::TensorOptions());
  reference.init_weights();
  const auto expected = reference.unique_parameters();
  dist::run_local_ranks(3, [&](int64_t rank, const dist::Store& store) {  // 3: uneven shards, padded
    const dist::Mesh mesh({.dp_shard = 3}, rank, store, kFast);
    nn::manual_init_seed(42);
    llama3::Llama3 model(test::parity_args(), 64, at::TensorOptions());
    const Parallelized parallel = parallelize(model, mesh, parallel::plan(model.sharding_spec(), {}, mesh.shape()));
    model.init_weights();
    const auto params = model.unique_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      RANK_CHECK_INFO("parameter " << i, at::equal(test::whole(params[i], mesh), expected[i]));
    }
  });
}

TEST_CASE("FSDP keeps 1/N of the parameter, gradient and optimizer bytes per rank", "[parallel][fsdp][memory]") {
  const int64_t single = single_rank().local_state_bytes;
  // Padding: each parameter's dim 0 rounds up to a multiple of N.
  int64_t padding_elems = 0;
  {
    llama3::Llama3 model(test::parity_args(), 64, at::TensorOptions().device(at::kMeta));
    for (const auto& p : model.unique_parameters()) {
      const int64_t rows = p.size(0), per_rank = (rows + 3) / 4;
      padding_elems += (per_rank * 4 - rows) * (p.numel() / rows);
    }
  }
  std::vector<int64_t> bytes(4);
  dist::run_local_ranks(4, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 4}, rank, store, kFast);
    bytes[static_cast<size_t>(rank)] = test::train_parity(mesh, {.steps = 1}).local_state_bytes;
  });
  for (int64_t b : bytes) CHECK(b * 4 == single + padding_elems * 4 /*bytes*/ * 4 /*param, grad, m, v*/);
}

TEST_CASE("reshard_after_forward frees gathered parameters between forward and backward", "[parallel][fsdp][memory]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 2}, rank, store, kFast);
    for (const ReshardAfterForward policy :
         {ReshardAfterForward::always, ReshardAfterForward::default_, ReshardAfterForward::never}) {
      nn::manual_init_seed(1);
      llama3::Llama3 model(test::parity_args(), 32, at::TensorOptions());
      parallel::ParallelPlan plan = parallel::plan(model.sharding_spec(), {}, mesh.shape());
      plan.data_parallel.options.reshard_after_forward = policy;
      const Parallelized parallel = parallelize(model, mesh, plan);
      parallel::DataParallel* dp = parallel.data_parallel();
      model.init_weights();
      const at::Tensor tokens = at::randint(512, {2, 32}, at::kLong);  // (B, S)
      RANK_CHECK(dp->gathered_bytes() == 0);
      const at::Tensor loss = model.forward(tokens).square().mean();
      const int64_t after_forward = dp->gathered_bytes();
      // Bytes of the whole model, of the last unit (norm + output) and of the last block.
      const llama3::Llama3 meta(test::parity_args(), 32, at::TensorOptions().device(at::kMeta));
      const int64_t full_model = meta.num_params() * 4;
      const int64_t last_unit = (meta.norm->weight.numel() + meta.output->weight.numel()) * 4;
      int64_t last_block = 0;
      for (const auto& p : meta.layers.back()->parameters()) last_block += p.numel() * 4;
      // titan sees no end-of-forward hook, so the last unit stays gathered until its backward under
      // every policy; "default" also keeps the last block (backward needs it next).
      if (policy == ReshardAfterForward::always)
        RANK_CHECK_INFO("policy always: " << after_forward << " bytes", after_forward == last_unit);
      if (policy == ReshardAfterForward::default_)
        RANK_CHECK_INFO("policy default: " << after_forward << " bytes", after_forward == last_unit + last_block);
      if (policy == ReshardAfterForward::never)
        RANK_CHECK_INFO("policy never: " << after_forward << " bytes", after_forward == full_model);
      loss.backward();
      RANK_CHECK(dp->gathered_bytes() == 0);  // every unit is freed after its backward
      for (const auto& p : model.unique_parameters()) RANK_CHECK(p.grad().defined());
    }
  });
}

TEST_CASE("FSDP prefetches the next all-gather and reduce-scatters during backward", "[parallel][fsdp][overlap]") {
  using Kind = parallel::DataParallelEvent::Kind;
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 2}, rank, store, kFast);
    const test::ParityResult r =
        test::train_parity(mesh, {.steps = 1, .reshard = ReshardAfterForward::always, .trace = true});
    const auto events = r.applied.data_parallel()->trace();
    const int64_t units = r.applied.data_parallel()->num_units();
    auto first = [&](Kind kind, int64_t unit) {
      for (size_t i = 0; i < events.size(); ++i) {
        if (events[i].kind == kind && events[i].unit == unit) return static_cast<int64_t>(i);
      }
      return int64_t{-1};
    };
    auto last = [&](Kind kind, int64_t unit) {
      for (size_t i = events.size(); i-- > 0;) {
        if (events[i].kind == kind && events[i].unit == unit) return static_cast<int64_t>(i);
      }
      return int64_t{-1};
    };
    for (int64_t u = 0; u + 1 < units; ++u) {
      // Forward prefetch: unit u+1's all-gather is issued while unit u's layers still compute.
      RANK_CHECK_INFO("unit " << u, first(Kind::kGatherIssued, u + 1) < last(Kind::kUse, u));
      RANK_CHECK(first(Kind::kGatherIssued, u + 1) >= 0);
    }
    const int64_t last_use =
        last(Kind::kUse, 0) > last(Kind::kUse, units - 1) ? last(Kind::kUse, 0) : last(Kind::kUse, units - 1);
    for (int64_t u = units - 1; u > 0; --u) {
      const int64_t reduce = first(Kind::kReduceIssued, u);
      RANK_CHECK_INFO("backward unit " << u, reduce > last_use);
      // Its reduce-scatter is issued before the unit below has even been gathered for backward.
      RANK_CHECK_INFO("backward unit " << u, reduce < last(Kind::kGatherWaited, u - 1));
    }
    RANK_CHECK(last(Kind::kBackwardDone, -1) > first(Kind::kReduceIssued, 0));
  });
}

TEST_CASE("an unknown FSDP unit path is an error naming it", "[parallel][fsdp]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 2}, rank, store, kFast);
    llama3::Llama3 model(test::parity_args(), 32, at::TensorOptions());
    std::string error;
    try {
      (void)parallelize(model, mesh, {.data_parallel = {.units = {{"layers.99"}}}});
    } catch (const std::exception& e) {
      error = e.what();
    }
    RANK_CHECK_INFO(error, error.find("'layers.99'") != std::string::npos);
  });
}
