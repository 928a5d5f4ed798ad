// SPDX-License-Identifier: BSD-3-Clause
// Context parallelism against one rank: the parity model (vocab 512, seq 64), 8 steps, fp32, Gloo, ranks
// as threads, same tolerances as the other layouts (parity_check.hpp; the attention merge adds
// log-sum-exp reordering, ~1e-6 relative; Ulysses reorders nothing but the all-to-alls' copies). CP 2 and CP 4
// with both K/V exchanges and headtail on and off, Ulysses CP 2 (headtail on and off, with documents, x TP 2),
// document masking, FSDP 2 x CP 2, CP 2 x TP 2, CP 2 x PP 2, and the 4-D PP 2 x FSDP 2 x CP 2 x TP 2
// (16 ranks; the same debugmodel: 6 blocks of dim 256, 64 tokens = 16 per cp rank, 8 per tp rank).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "parity_check.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/parallel/context_parallel.hpp"
#include "titan/parallel/planner.hpp"

namespace titan::test {

TEST_CASE("CP 2 matches one rank with either K/V exchange and headtail on or off", "[parallel][cp][parity]") {
  const CpRotateMethod rotate = GENERATE(CpRotateMethod::allgather, CpRotateMethod::alltoall, CpRotateMethod::ulysses);
  const bool headtail = GENERATE(true, false);
  INFO(fmt::format("rotate {} headtail {}", rotate, headtail));
  check_parity({.cp = 2}, {.load_balance = headtail, .rotate = rotate});
}

TEST_CASE("CP 4 matches one rank with either K/V exchange and headtail on or off", "[parallel][cp][parity][full]") {
  const CpRotateMethod rotate = GENERATE(CpRotateMethod::allgather, CpRotateMethod::alltoall);
  const bool headtail = GENERATE(true, false);
  INFO(fmt::format("rotate {} headtail {}", rotate, headtail));
  check_parity({.cp = 4}, {.load_balance = headtail, .rotate = rotate});
}

TEST_CASE("CP 2 with two documents per row matches one rank with document masking", "[parallel][cp][parity][full]") {
  check_parity({.cp = 2}, {.rotate = CpRotateMethod::alltoall, .documents = true});
}

TEST_CASE("Ulysses CP 2 with two documents per row matches one rank with document masking",
          "[parallel][cp][ulysses][parity]") {
  check_parity({.cp = 2}, {.rotate = CpRotateMethod::ulysses, .documents = true});
}

TEST_CASE("Ulysses CP 2 x TP 2 matches one rank (one head per rank in attention)",
          "[parallel][cp][tp][ulysses][parity]") {
  check_parity({.cp = 2, .tp = 2}, {.rotate = CpRotateMethod::ulysses});
}

TEST_CASE("Ulysses with heads that tp x cp does not divide is refused by the plan, naming the keys",
          "[parallel][cp][ulysses]") {
  const llama3::Llama3 model(parity_args(), 32, at::TensorOptions().device(at::kMeta));  // 4 heads
  const std::string error = error_of([&] {
    (void)parallel::plan(model.sharding_spec(),
                         {.parallelism = {.context_parallel_rotate_method = CpRotateMethod::ulysses}},
                         {.cp = 4, .tp = 2});
  });
  CHECK(error.find("expected n_heads (4) divisible by parallelism.tensor_parallel_degree x context_parallel_degree "
                   "= 2 x 4 under context_parallel_rotate_method ulysses") != std::string::npos);
  CHECK_NOTHROW(parallel::plan(model.sharding_spec(),
                               {.parallelism = {.context_parallel_rotate_method = CpRotateMethod::ulysses}},
                               {.cp = 2, .tp = 2}));
}

TEST_CASE("FSDP 2 x CP 2 matches one rank (FSDP over dp_shard x cp)", "[parallel][cp][fsdp][parity][full]") {
  check_parity({.dp_shard = 2, .cp = 2});
}

TEST_CASE("CP 2 x TP 2 matches one rank", "[parallel][cp][tp][parity][full]") { check_parity({.cp = 2, .tp = 2}); }

TEST_CASE("CP 2 x PP 2 matches one rank", "[parallel][cp][pipeline][parity][full]") {
  check_parity({.pp = 2, .cp = 2}, {.schedule = PipelineSchedule::interleaved_1f1b});
}

TEST_CASE("4-D PP 2 x FSDP 2 x CP 2 x TP 2 matches one rank (16 ranks)", "[parallel][cp][4d][parity][full]") {
  check_parity({.pp = 2, .dp_shard = 2, .cp = 2, .tp = 2}, {.rotate = CpRotateMethod::alltoall});
}

TEST_CASE("FSDP under CP shards over dp_shard_cp and says so", "[parallel][cp]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.cp = 2}, rank, store, kFast);
    llama3::Llama3 model(parity_args(), 32, at::TensorOptions());
    const Parallelized applied = parallelize(model, mesh, parallel::plan(model.sharding_spec(), {}, mesh.shape()));
    RANK_CHECK_INFO(applied.describe(), applied.describe() == "CP(cp=2, headtail, allgather) + FSDP(dp_shard_cp=2)");
    const parallel::ShardedParam* sp =
        parallel::sharded_param(model.layers[0]->attention_as<nn::Attention>()->wq->weight);
    RANK_CHECK(sp != nullptr && sp->placements.at(0).first == "dp_shard_cp");
  });
}

TEST_CASE("context-parallel plans and batches that cannot run are clear errors", "[parallel][cp]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.cp = 2}, rank, store, kFast);
    {  // a cp mesh whose plan names no attention
      llama3::Llama3 model(parity_args(), 32, at::TensorOptions());
      parallel::ParallelPlan plan = parallel::plan(model.sharding_spec(), {}, mesh.shape());
      plan.context_parallel.attention_modules.clear();
      const std::string error = error_of([&] { (void)parallelize(model, mesh, plan); });
      RANK_CHECK_INFO(error, error.find("has no CP-capable attention declared") != std::string::npos);
    }
    {  // a module that is not a CP-capable attention
      llama3::Llama3 model(parity_args(), 32, at::TensorOptions());
      parallel::ParallelPlan plan = parallel::plan(model.sharding_spec(), {}, mesh.shape());
      plan.context_parallel.attention_modules = {"layers.0.feed_forward"};
      const std::string error = error_of([&] { (void)parallelize(model, mesh, plan); });
      RANK_CHECK_INFO(error,
                      error.find("path 'layers.0.feed_forward' to be a CP-capable attention") != std::string::npos);
    }
    llama3::Llama3 model(parity_args(), 64, at::TensorOptions());
    const Parallelized applied = parallelize(model, mesh, parallel::plan(model.sharding_spec(), {}, mesh.shape()));
    model.init_weights();
    const at::Tensor tokens = at::zeros({2, 34}, at::kLong);
    {  // 34 tokens do not split into 2 x 2 chunks
      const std::string error = error_of([&] { (void)applied.local_batch({.tokens = tokens, .labels = tokens}); });
      RANK_CHECK_INFO(error, error.find("expected training.seq_len divisible by 4") != std::string::npos);
    }
    {  // the forward of a local part without its attention context
      const at::Tensor whole = at::zeros({2, 64}, at::kLong);
      const auto local = applied.local_batch({.tokens = whole, .labels = whole});
      const std::string error = error_of([&] { (void)model.forward(local.tokens); });
      RANK_CHECK_INFO(error,
                      error.find("expected the forward to run on a sequence sharded over 2") != std::string::npos);
    }
  });
}

TEST_CASE("CP x TP with heads that tp does not divide is a clear error", "[parallel][cp][tp]") {
  llama3::Llama3Args args = parity_args();
  args.n_heads = 6;  // 6 query heads over tp 4
  args.n_kv_heads = 6;
  args.dim = 192;
  llama3::Llama3 model(args, 32, at::TensorOptions().device(at::kMeta));
  const std::string error =
      error_of([&] { (void)parallel::tensor_parallel_plan(model.sharding_spec(), 4, true, true); });
  CHECK(error.find("divisible by the tensor-parallel degree 4") != std::string::npos);
}

}  // namespace titan::test
