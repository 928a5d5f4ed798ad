// SPDX-License-Identifier: BSD-3-Clause
// Pipeline parallelism against one rank: every schedule at pp 2 and pp 4, and PP composed with FSDP
// and TP, 8 steps of the parity model (6 blocks; vocab 512) with ranks as threads; tolerances as in
// parity_check.hpp (a microbatch of one sequence sums its tokens in another order than the whole batch).
// Also: a part builds and initialises exactly the whole model's weights, and the plan's bad input.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "parity_check.hpp"
#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/parallel/planner.hpp"

using namespace titan;
using test::check_parity;
using test::kFast;
using test::ParityResult;
using test::ParityRun;
using test::train_parity;

namespace {

void check_schedule(int64_t pp, PipelineSchedule schedule) {
  INFO(fmt::format("{} on pp {}", schedule, pp));
  check_parity({.pp = pp}, {.schedule = schedule});
}

}  // namespace

TEST_CASE("pipeline parts initialise and compute exactly what the whole model does", "[parallel][pipeline]") {
  const auto args = test::parity_args();  // 6 blocks
  nn::manual_init_seed(7);
  llama3::Llama3 whole(args, 16, at::TensorOptions());
  whole.init_weights();
  const auto reference = whole.named_parameters(/*recurse=*/true);
  const std::vector<std::vector<std::string>> stages{
      {"tok_embeddings", "layers.0", "layers.1"}, {"layers.2", "layers.3"}, {"layers.4", "layers.5", "norm", "output"}};
  const at::Tensor tokens = at::randint(args.vocab_size, {2, 16}, at::kLong);  // (B, S)
  at::Tensor h = tokens;
  int64_t tensors = 0;
  for (const auto& modules : stages) {
    nn::manual_init_seed(7);
    llama3::Llama3 part(args, 16, at::TensorOptions(), modules);
    part.init_weights();
    for (const auto& item : part.named_parameters(/*recurse=*/true)) {
      INFO(item.key());
      REQUIRE(reference.contains(item.key()));
      CHECK(at::equal(item.value(), reference[item.key()]));
      ++tensors;
    }
    h = part.forward_part(h, modules);
  }
  CHECK(tensors == static_cast<int64_t>(reference.size()));
  CHECK(at::allclose(h, whole.forward(tokens), 1e-5, 1e-6));
  // A split no schedule makes (blocks out of order, apart, with the head): each parameter draws by its
  // name, so any part holds the whole model's values.
  nn::manual_init_seed(7);
  llama3::Llama3 odd(args, 16, at::TensorOptions(), {"layers.5", "layers.1", "output"});
  odd.init_weights();
  CHECK(odd.named_parameters(/*recurse=*/true).size() == 1 + 2 * 9);
  for (const auto& item : odd.named_parameters(/*recurse=*/true)) {
    INFO(item.key());
    CHECK(at::equal(item.value(), reference[item.key()]));
  }
  CHECK_THROWS_WITH(llama3::Llama3(args, 16, at::TensorOptions(), {"layers.6"}), Catch::Contains("got 'layers.6'"));
}

TEST_CASE("GPipe and 1F1B on pp 2 match one rank", "[parallel][pipeline][parity]") {
  for (auto schedule : {PipelineSchedule::gpipe, PipelineSchedule::schedule_1f1b}) check_schedule(2, schedule);
}

TEST_CASE("GPipe and 1F1B on pp 4 match one rank", "[parallel][pipeline][parity][full]") {
  for (auto schedule : {PipelineSchedule::gpipe, PipelineSchedule::schedule_1f1b}) check_schedule(4, schedule);
}

TEST_CASE("Interleaved 1F1B and Looped BFS on pp 2 and 4 match one rank", "[parallel][pipeline][parity][full]") {
  for (int64_t pp : {2, 4}) {
    for (auto schedule : {PipelineSchedule::interleaved_1f1b, PipelineSchedule::looped_bfs})
      check_schedule(pp, schedule);
  }
}

TEST_CASE("zero-bubble schedules on pp 2 and 4 match one rank", "[parallel][pipeline][parity][zb][full]") {
  for (int64_t pp : {2, 4}) {
    for (auto schedule :
         {PipelineSchedule::interleaved_zero_bubble, PipelineSchedule::zbv_zero_bubble, PipelineSchedule::dual_pipe_v})
      check_schedule(pp, schedule);
  }
}

TEST_CASE("DualPipeV's overlapped F/B pairs on pp 2 give the sequential losses and weights bitwise",
          "[parallel][pipeline][zb][parity]") {
  // The sequential run, then the pairs at once (the backward on a second thread), also under full AC
  // (the recompute runs on the backward's thread while the other microbatch's forward records).
  const ParityRun sequential{.steps = 3, .schedule = PipelineSchedule::dual_pipe_v, .overlap_f_b = false};
  ParityRun overlapped = sequential, checkpointed = sequential;
  overlapped.overlap_f_b = checkpointed.overlap_f_b = true;
  checkpointed.ac_mode = AcMode::full;
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.pp = 2}, rank, store, kFast);
    ParityResult reference = train_parity(mesh, sequential);
    RANK_CHECK(reference.applied.pipeline()->last_stats().overlapped_pairs == 0);
    RANK_CHECK(reference.applied.pipeline()->describe().find("F/B pairs sequential") != std::string::npos);
    reference.applied = Parallelized();  // before the next model: its modules may reuse the addresses
    for (const ParityRun& run : {overlapped, checkpointed}) {
      ParityResult result = train_parity(mesh, run);
      // 8 microbatches on pp 2: each rank's main phase overlaps 2 x (8 - 4 + rank + 1) pairs, rank 0's
      // cool-down one more.
      RANK_CHECK(result.applied.pipeline()->last_stats().overlapped_pairs == 2 * (5 + rank) + (rank == 0 ? 1 : 0));
      RANK_CHECK(result.applied.pipeline()->describe().find("F/B pairs overlapped") != std::string::npos);
      RANK_CHECK(result.losses == reference.losses);
      RANK_CHECK(result.grad_norms == reference.grad_norms);
      RANK_CHECK(result.weights.size() == reference.weights.size());
      for (size_t i = 0; i < result.weights.size() && i < reference.weights.size(); ++i) {
        RANK_CHECK_INFO(result.names[i], at::equal(result.weights[i], reference.weights[i]));
      }
      result.applied = Parallelized();
    }
  });
}

TEST_CASE("PP 2 x FSDP 2 matches one rank", "[parallel][pipeline][fsdp][parity][full]") {
  check_parity({.pp = 2, .dp_shard = 2}, {.schedule = PipelineSchedule::interleaved_1f1b});
}

TEST_CASE("PP 2 x TP 2 matches one rank", "[parallel][pipeline][tp][parity][full]") {
  check_parity({.pp = 2, .tp = 2}, {.schedule = PipelineSchedule::schedule_1f1b});
}

TEST_CASE("PP 2 x FSDP 2 x TP 2 matches one rank", "[parallel][pipeline][fsdp][tp][parity][full]") {
  check_parity({.pp = 2, .dp_shard = 2, .tp = 2}, {.schedule = PipelineSchedule::zbv_zero_bubble});
}

TEST_CASE("pipeline plans that cannot run are clear errors", "[parallel][pipeline]") {
  const auto args = test::parity_args();  // 6 blocks
  // A single-stage schedule with two stages per rank.
  {
    llama3::Llama3 model(args, 16, at::TensorOptions().device(at::kMeta));
    parallel::ParallelPlan plan = parallel::plan(model.sharding_spec(), {}, dist::MeshShape{});
    plan.pipeline = {.stages = {{"tok_embeddings", "layers.0", "layers.1", "layers.2"},
                                {"layers.3", "layers.4", "layers.5", "norm", "output"}}};
    CHECK_THROWS_WITH((void)parallelize(model, dist::Mesh(), plan),
                      Catch::Contains("expected 1 stage(s) per rank for schedule 1F1B, got 2 stages on 1 ranks"));
  }
  // A rank that holds modules of another stage.
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.pp = 2}, rank, store, kFast);
    llama3::Llama3 model(args, 16, at::TensorOptions().device(at::kMeta));  // the whole model on both ranks
    parallel::ParallelPlan plan = parallel::plan(model.sharding_spec(), {}, mesh.shape());
    RANK_CHECK(plan.pipeline.stages.size() == 2);
    std::string error;
    try {
      (void)parallelize(model, mesh, plan);
    } catch (const c10::Error& e) {
      error = e.what();
    }
    RANK_CHECK_INFO(error, error.find("to hold exactly its stages' modules") != std::string::npos);
  });
  // The local batch must split into microbatches.
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.pp = 2}, rank, store, kFast);
    const llama3::Llama3 whole(args, 16, at::TensorOptions().device(at::kMeta));
    const parallel::ParallelPlan plan =
        parallel::plan(whole.sharding_spec(), {.parallelism = {.pipeline_parallel_microbatch_size = 2}}, mesh.shape());
    llama3::Llama3 model(args, 16, at::TensorOptions(), parallel::pipeline_modules(plan.pipeline, mesh));
    Parallelized applied = parallelize(model, mesh, plan);
    model.init_weights();
    const at::Tensor tokens = at::zeros({3, 16}, at::kLong);  // (B, S): 3 sequences, microbatches of 2
    std::string error;
    try {
      (void)applied.pipeline()->step(
          [&](int64_t s, const at::Tensor& x, const nn::AttentionContext& c) {
            return model.forward_part(x, plan.pipeline.stages[s], c);
          },
          tokens, tokens, {}, 1.0);
    } catch (const c10::Error& e) {
      error = e.what();
    }
    RANK_CHECK_INFO(error,
                    error.find("local batch (3 sequences) divisible by the microbatch size 2") != std::string::npos);
  });
  // Schedule names are checked where the config is read, with the list of choices.
  const char* argv[] = {"train", "--parallelism.pipeline_parallel_schedule", "1F2B"};
  CHECK_THROWS_WITH(parse_args(3, argv), Catch::Contains("1F1B|GPipe|Interleaved1F1B"));
}
