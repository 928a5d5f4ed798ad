// SPDX-License-Identifier: BSD-3-Clause
// DeepSeek-V3 under pipeline and context parallelism against one process, ranks as threads on the strict backend
// (test::check_named_runs): PP 2 with 1F1B and with ZBV (zero-bubble, split backward: each block's input gradient
// first, its weight gradients later), PP 2 x FSDP 2, and CP 2; the losses, grad norms, every weight and every MoE
// layer's expert bias (the aux-loss-free balancing, updated before each optimizer step) after the last step.
//
// Tolerance: check_named_runs' (1e-5 relative on losses and grad norms, 1e-5 on the weights), argued in
// tests/parallel/user_model_parity_test.cpp: the same fp32 math with sums in another order (a microbatch of one
// sequence, a stage's gradients reduced over its FSDP pair). The expert biases move by sign(mean load - load) * rate,
// a function of integer token counts: no token's top-3 choice sits within 1e-5 of a tie, so they are equal.
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>

#include "models/decoder_train_util.hpp"
#include "test_util.hpp"
#include "titan/models/deepseek_v3/model.hpp"
#include "titan/parallel/expert_parallel.hpp"
#include "titan/parallel/planner.hpp"

namespace deepseek_v3_pipeline_test {
namespace {

using namespace titan;

constexpr int64_t kSeq = 16;
// A stage split that drops or doubles a gradient shows at step 2; 6 steps move every expert bias several times, and at
// this rate the one process's loss falls past the batches' scatter (check_named_runs asks it).
constexpr int64_t kSteps = 6;
constexpr double kLr = 4e-3;

// The tiny flavor (MLA, a dense block, MoE blocks with shared experts) with 4 blocks, so that ZBV's four stages hold
// one each, and a 256-token vocabulary.
deepseek_v3::DeepSeekV3Args pipeline_args() {
  deepseek_v3::DeepSeekV3Args a = deepseek_v3::flavor("tiny");
  a.n_layers = 4;
  a.vocab_size = 256;
  a.max_seq_len = kSeq;
  return a;
}

// The model trained as one rank of `mesh` sees it, each MoE layer's expert bias after the last step beside the
// weights (under PP, those of the rank's stages).
test::NamedRun train_pipelined(const dist::Mesh& mesh, PipelineSchedule schedule) {
  std::shared_ptr<parallel::ExpertParallel> balancing;
  std::map<std::string, at::Tensor> biases;
  test::NamedRun out = test::train_decoder<deepseek_v3::DeepSeekV3>(
      mesh, pipeline_args(),
      {.steps = kSteps,
       .lr = kLr,
       .batches = {.global_batch = 4, .seq_len = kSeq},
       .seed = 7,
       .options = {.parallelism = {.pipeline_parallel_schedule = schedule}},
       .prepared =
           [&](deepseek_v3::DeepSeekV3& m) {
             // The trainer's balancing at ep 1: the counts of each step summed over the dp x cp ranks.
             balancing = std::make_shared<parallel::ExpertParallel>(
                 parallel::apply_expert_parallel(m, mesh, {.moe_modules = parallel::moe_modules(m)}));
           },
       .after_backward =
           [&](deepseek_v3::DeepSeekV3& m, int64_t step) {
             (void)balancing->update_expert_bias();
             if (step + 1 < kSteps) return;
             for (const auto& item : m.named_buffers(/*recurse=*/true)) {
               if (item.key().ends_with(".expert_bias")) biases[item.key()] = item.value().clone();
             }
           }});
  for (auto& [name, bias] : biases) out.weights[name] = bias;
  return out;
}

// The one process's biases moved: the balancing ran and the comparison of them means something.
void check_biases_move() {
  const test::NamedRun one = train_pipelined(dist::Mesh(), PipelineSchedule::schedule_1f1b);
  int64_t moved = 0;
  for (const auto& [name, w] : one.weights) {
    if (name.ends_with(".expert_bias")) moved += w.abs().max().item<double>() > 0 ? 1 : 0;
  }
  CHECK(moved == 3);  // layers 1 to 3
}

}  // namespace

TEST_CASE("deepseek_v3 under PP 2 with 1F1B and with ZBV zero-bubble trains as in one process with its expert biases",
          "[models][deepseek_v3][pipeline][parity]") {
  check_biases_move();
  for (const PipelineSchedule schedule : {PipelineSchedule::schedule_1f1b, PipelineSchedule::zbv_zero_bubble}) {
    INFO(fmt::format("{}", schedule));
    test::check_named_runs({.pp = 2}, [&](const dist::Mesh& mesh) { return train_pipelined(mesh, schedule); });
  }
}

TEST_CASE("deepseek_v3 under PP 2 x FSDP 2 trains as in one process", "[models][deepseek_v3][pipeline][fsdp][parity]") {
  test::check_named_runs({.pp = 2, .dp_shard = 2},
                         [](const dist::Mesh& mesh) { return train_pipelined(mesh, PipelineSchedule::schedule_1f1b); });
}

// MLA's attention follows the context (nn::causal_attention): each cp rank attends its chunks of every sequence to
// the whole; the MoE routes each rank's tokens, the expert counts summed over dp x cp before the bias moves.
TEST_CASE("deepseek_v3 under CP 2 trains as in one process", "[models][deepseek_v3][cp][parity]") {
  test::check_named_runs({.cp = 2},
                         [](const dist::Mesh& mesh) { return train_pipelined(mesh, PipelineSchedule::schedule_1f1b); });
}

TEST_CASE("deepseek_v3 plans pipeline stages of its blocks and refuses cp only with multi-token prediction",
          "[models][deepseek_v3][pipeline]") {
  deepseek_v3::DeepSeekV3Args args = pipeline_args();
  const deepseek_v3::DeepSeekV3 plain(args, kSeq, at::TensorOptions().device(at::kMeta));
  const parallel::ParallelPlan plan =
      parallel::plan(plain.sharding_spec(),
                     {.parallelism = {.pipeline_parallel_schedule = PipelineSchedule::schedule_1f1b}}, {.pp = 2});
  REQUIRE(plan.pipeline.stages.size() == 2);
  CHECK(plan.pipeline.stages.front().front() == "tok_embeddings");
  CHECK(plan.pipeline.stages.back().back() == "output");
  (void)parallel::plan(plain.sharding_spec(), {}, {.cp = 2});

  args.num_nextn_predict_layers = 1;
  const deepseek_v3::DeepSeekV3 mtp(args, kSeq, at::TensorOptions().device(at::kMeta));
  // The depths go on the last stage (tests/models/deepseek_v3_mtp_pipeline_test.cpp).
  CHECK(parallel::plan(mtp.sharding_spec(), {}, {.pp = 2}).pipeline.stages.back().front() == "layers.2");
  CHECK_THAT(test::error_of([&] { (void)parallel::plan(mtp.sharding_spec(), {}, {.cp = 2}); }),
             Catch::Contains("multi-token prediction under context parallelism is not built"));
}

}  // namespace deepseek_v3_pipeline_test
