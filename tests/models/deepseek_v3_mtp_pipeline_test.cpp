// SPDX-License-Identifier: BSD-3-Clause
// DeepSeek-V3's multi-token prediction under pipeline parallelism against one process, ranks as threads on the strict
// backend (test::check_named_ranks): PP 2 x FSDP 2 with 1F1B, PP 2 with ZBV (zero-bubble, a V: the first and the last
// stage on one rank, which reads its one embedding) and with InterleavedZeroBubble (split backward, the first stage on
// pp rank 0 and the last on pp rank 1). The depths run on the last stage with the tokens the trainer hands it
// (mtp_labelled) and a copy of the first stage's embedding whose gradient is summed with the original's
// (sum_mtp_embedding_grads) and which the grad norm counts once. Compared: the losses, grad norms, the MTP loss of
// each step, every weight after the last step (the copy under the embedding's own name, so it is held to the one
// process's embedding too), and the two copies bitwise equal to each other. And the checkpoint of a PP 2 x FSDP 2 part:
// the embedding saved once, under the one process's key, loaded in one process and back.
//
// Tolerance: check_named_ranks' (1e-5 relative on losses and grad norms, 1e-5 on the weights), argued in
// tests/parallel/user_model_parity_test.cpp: the same fp32 math with sums in another order (a microbatch of one
// sequence, a stage's gradients reduced over its FSDP pair, the embedding's two gradient halves added on another rank).
// A copy whose gradient misses the other half, or a norm that counts it twice, moves the embedding by up to lr per
// step from the first step: far outside it. The copies are equal bitwise: g_first + g_last is g_last + g_first in
// IEEE arithmetic, and AdamW's update is elementwise.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "models/decoder_train_util.hpp"
#include "test_util.hpp"
#include "titan/checkpoint/checkpoint.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/decoder_spec.hpp"
#include "titan/models/deepseek_v3/model.hpp"
#include "titan/parallel/pipeline_schedule.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/semi_sync.hpp"
#include "titan/train/training_state.hpp"

namespace deepseek_v3_mtp_pipeline_test {
namespace {

using namespace titan;

constexpr int64_t kSeq = 16;
constexpr int64_t kBatch = 4;
// A split that drops or doubles a gradient shows at step 2; at this rate the one process's loss falls past the
// batches' scatter in 6 steps (check_named_runs asks it).
constexpr int64_t kSteps = 6;
constexpr double kLr = 4e-3;
const std::string kMtpLosses = "(mtp loss of each step)";

// The tiny flavor (MLA, a dense block, MoE blocks with shared experts) with 4 blocks, so that ZBV's four stages hold
// one each, a 256-token vocabulary and `depth` MTP depths (MoE blocks).
deepseek_v3::DeepSeekV3Args mtp_pipeline_args(int64_t depth) {
  deepseek_v3::DeepSeekV3Args a = deepseek_v3::flavor("tiny");
  a.n_layers = 4;
  a.vocab_size = 256;
  a.max_seq_len = kSeq;
  a.num_nextn_predict_layers = depth;
  return a;
}

// The model trained as one rank of `mesh` sees it, the MTP loss of each step (summed over dp and pp: the last stage
// holds the depths) beside the weights.
test::NamedRun train_mtp_pipelined(const dist::Mesh& mesh, PipelineSchedule schedule, int64_t depth) {
  at::Tensor mtp_losses = at::zeros({kSteps}, at::kDouble);  // (steps)
  test::NamedRun out = test::train_decoder<deepseek_v3::DeepSeekV3>(
      mesh, mtp_pipeline_args(depth),
      {.steps = kSteps,
       .lr = kLr,
       .batches = {.global_batch = kBatch, .seq_len = kSeq},
       .seed = 7,
       .options = {.parallelism = {.pipeline_parallel_schedule = schedule}},
       .prepared =
           [&](deepseek_v3::DeepSeekV3& m) {
             if (m.mtp) m.mtp->loss_scale = 1.0 / static_cast<double>(kBatch * kSeq);
           },
       .before_step =
           [](deepseek_v3::DeepSeekV3& m, int64_t) {
             if (m.mtp) m.mtp->loss.zero_();
           },
       .after_backward =
           [&](deepseek_v3::DeepSeekV3& m, int64_t step) {
             at::Tensor mtp = (m.mtp ? m.mtp->loss.to(at::kDouble) : at::zeros({}, at::kDouble)).reshape({1});  // (1)
             for (const char* axis : {"dp", "pp"}) {
               if (mesh.size(axis) > 1) mesh.group(axis).all_reduce(mtp).wait();
             }
             mtp_losses[step].copy_(mtp[0]);
           }});
  out.weights[kMtpLosses] = mtp_losses;
  return out;
}

// Every rank's run equals the one process's (check_named_ranks), and the ranks holding the embedding (the first
// stage's, and the last stage's copy under the same name) hold it bitwise alike: `holders` of them.
void check_mtp_pipeline(const dist::MeshShape& shape, PipelineSchedule schedule, int64_t depth,
                        const test::NamedRun& one, size_t holders) {
  INFO(fmt::format("{} {} depth {}", shape, schedule, depth));
  const std::vector<test::NamedRun> runs = test::check_named_ranks(
      shape, one, [&](const dist::Mesh& mesh) { return train_mtp_pipelined(mesh, schedule, depth); });
  std::vector<at::Tensor> embeddings;  // (V, D) each
  for (const test::NamedRun& run : runs) {
    if (run.weights.contains("tok_embeddings.weight")) embeddings.push_back(run.weights.at("tok_embeddings.weight"));
  }
  REQUIRE(embeddings.size() == holders);
  for (const at::Tensor& e : embeddings) CHECK(at::equal(e, embeddings.front()));
}

// A rank's part of the one-depth model as the Trainer builds it (the plan from the whole model on meta, the rank's
// stages, parallelize, then init from `seed`).
struct MtpRankPart {
  std::shared_ptr<deepseek_v3::DeepSeekV3> model;
  std::unique_ptr<Parallelized> applied;

  MtpRankPart(const dist::Mesh& mesh, uint64_t seed) {
    const deepseek_v3::DeepSeekV3Args args = mtp_pipeline_args(1);
    nn::manual_init_seed(seed);
    const auto meta = deepseek_v3::DeepSeekV3::build(args, {.device = at::kMeta});
    const parallel::ParallelPlan plan = parallel::plan(meta->sharding_spec(), {}, mesh.shape());
    const std::vector<std::string> modules =
        plan.pipeline.stages.empty() ? std::vector<std::string>{} : parallel::pipeline_modules(plan.pipeline, mesh);
    model = deepseek_v3::DeepSeekV3::build(args, {.device = at::kCPU, .modules = modules});
    applied = std::make_unique<Parallelized>(parallelize(*model, mesh, plan));
    model->init_weights();
  }
  // The trainer's checkpoint state of the part: the copy under the embedding's key, written by the first stage only;
  // with `outer`, DiLoCo's outer state of the same parameters too.
  checkpoint::State state(const dist::Mesh* mesh, SemiSync* outer = nullptr) const {
    const std::vector<at::Tensor> params = model->unique_parameters();
    const TrainingState training({.parameters = params,
                                  .names = parameter_names(*model, params),
                                  .semi_sync = outer,
                                  .copies = mtp_embedding_copies(*model),
                                  .mesh = mesh});
    return training.state();
  }
  // The embedding this part holds, whole: the first stage's or the last stage's copy (undefined: neither).
  at::Tensor embedding(const dist::Mesh& mesh) const {
    if (model->tok_embeddings) return parallel::full_tensor(model->tok_embeddings->weight, mesh);
    return model->mtp ? parallel::full_tensor(model->mtp->embedding->weight, mesh) : at::Tensor();
  }
};

}  // namespace

TEST_CASE("deepseek_v3 with multi-token prediction under PP 2 x FSDP 2 with 1F1B trains as in one process",
          "[models][deepseek_v3][mtp][pipeline][fsdp][parity]") {
  const test::NamedRun one = train_mtp_pipelined(dist::Mesh(), PipelineSchedule::schedule_1f1b, 1);
  CHECK(one.losses.back() < one.losses.front() - 0.05);        // it trained
  CHECK(one.weights.at(kMtpLosses).min().item<double>() > 0);  // the depth's loss is there to compare
  // Each pp 0 rank holds the embedding, each pp 1 rank the copy (its FSDP shard gathered).
  check_mtp_pipeline({.pp = 2, .dp_shard = 2}, PipelineSchedule::schedule_1f1b, 1, one, 4);
}

TEST_CASE(
    "deepseek_v3 with two multi-token prediction depths under PP 2 with zero-bubble schedules trains as in one "
    "process",
    "[models][deepseek_v3][mtp][pipeline][parity]") {
  const test::NamedRun one = train_mtp_pipelined(dist::Mesh(), PipelineSchedule::schedule_1f1b, 2);
  CHECK(one.losses.back() < one.losses.front() - 0.05);
  // ZBV's V puts stages 0 and 3 on pp rank 0: one embedding, no copy. InterleavedZeroBubble loops them: stage 0 on
  // pp rank 0, stage 3 (the depths) on pp rank 1 with the copy.
  check_mtp_pipeline({.pp = 2}, PipelineSchedule::zbv_zero_bubble, 2, one, 1);
  check_mtp_pipeline({.pp = 2}, PipelineSchedule::interleaved_zero_bubble, 2, one, 2);
}

TEST_CASE("deepseek_v3 multi-token prediction: the pipeline's last stage holds the depths and a copy of the embedding",
          "[models][deepseek_v3][mtp][pipeline]") {
  const deepseek_v3::DeepSeekV3Args args = mtp_pipeline_args(1);
  const deepseek_v3::DeepSeekV3 whole(args, kSeq, at::TensorOptions().device(at::kMeta));
  const parallel::ParallelPlan plan =
      parallel::plan(whole.sharding_spec(),
                     {.parallelism = {.pipeline_parallel_schedule = PipelineSchedule::schedule_1f1b}}, {.pp = 2});
  REQUIRE(plan.pipeline.stages.size() == 2);
  CHECK(plan.pipeline.stages.back() == std::vector<std::string>{"layers.2", "layers.3", "mtp", "norm", "output"});
  // The last stage's part: the depths, and the copy that stands for the embedding it does not hold.
  const deepseek_v3::DeepSeekV3 last(args, kSeq, at::TensorOptions().device(at::kMeta), plan.pipeline.stages.back());
  REQUIRE(last.mtp != nullptr);
  CHECK(last.tok_embeddings == nullptr);
  REQUIRE(last.mtp->embedding != nullptr);
  CHECK(last.mtp->embedding->weight.sizes() == whole.tok_embeddings->weight.sizes());
  CHECK(mtp_embedding_copies(last).size() == 1);
  const std::vector<at::Tensor> params = last.unique_parameters();
  const std::vector<std::string> names = parameter_names(last, params);
  CHECK(std::count(names.begin(), names.end(), "tok_embeddings.weight") == 1);
  CHECK(std::count(names.begin(), names.end(), "mtp.embedding.weight") == 0);
  // The first stage's part: no depths; the whole model: no copy.
  const deepseek_v3::DeepSeekV3 first(args, kSeq, at::TensorOptions().device(at::kMeta), plan.pipeline.stages.front());
  CHECK(first.mtp == nullptr);
  REQUIRE(whole.mtp != nullptr);
  CHECK(whole.mtp->embedding == nullptr);
  CHECK(mtp_embedding_copies(whole).empty());
  // A split by FLOPs weighs the depths on the stage with the head: the output's cost grows by what they add to the
  // model's FLOPs per token (integers below 2^53: exact in double).
  const deepseek_v3::DeepSeekV3 plain(mtp_pipeline_args(0), kSeq, at::TensorOptions().device(at::kMeta));
  const parallel::PipelineModuleCosts with = models::pipeline_costs(whole, kSeq);
  const parallel::PipelineModuleCosts without = models::pipeline_costs(plain, kSeq);
  CHECK(with.layers == without.layers);
  CHECK(with.output - without.output ==
        static_cast<double>(whole.num_flops_per_token(kSeq) - plain.num_flops_per_token(kSeq)));
  CHECK(with.output > without.output);
  // Context parallelism stays refused.
  CHECK_THAT(test::error_of([&] { (void)parallel::plan(whole.sharding_spec(), {}, {.cp = 2}); }),
             Catch::Contains("multi-token prediction under context parallelism is not built"));
}

// The checkpoint of a PP 2 x FSDP 2 run holds the embedding once, under the one process's key: the last stage's copy
// is not written (its owner is the first stage) and is filled from that key on load. Weights are compared bitwise:
// the init follows each weight's site, not the layout, and a load copies bytes.
// mtp_labelled hands the last stage's forwards the microbatches in order, counting them: every built-in schedule must
// run that stage's forwards in microbatch order, which validate_pipeline_program does not ask.
TEST_CASE("every built-in schedule runs the last stage's forwards in the microbatch order mtp_labelled counts",
          "[models][mtp][pipeline]") {
  for (const PipelineSchedule schedule :
       {PipelineSchedule::schedule_1f1b, PipelineSchedule::gpipe, PipelineSchedule::interleaved_1f1b,
        PipelineSchedule::looped_bfs, PipelineSchedule::interleaved_zero_bubble, PipelineSchedule::zbv_zero_bubble,
        PipelineSchedule::dual_pipe_v}) {
    for (const int64_t pp : {2, 4}) {
      const int64_t stages = parallel::num_pipeline_stages(schedule, pp, /*layers=*/8, /*layers_per_stage=*/0, 1, 1);
      const parallel::PipelineProgram program =
          parallel::make_pipeline_program(schedule, pp, stages, /*microbatches=*/2 * pp);
      std::vector<int64_t> order;  // the microbatches of the last stage's forwards, in program order
      for (const auto& row : program.actions) {
        for (const parallel::PipelineAction& a : row) {
          if (a.op == parallel::PipelineAction::Op::kForward && a.stage == stages - 1) order.push_back(a.microbatch);
        }
      }
      INFO(fmt::format("{} pp {}", schedule, pp));
      REQUIRE(static_cast<int64_t>(order.size()) == 2 * pp);
      for (size_t i = 0; i < order.size(); ++i) CHECK(order[i] == static_cast<int64_t>(i));
    }
  }
}

TEST_CASE(
    "deepseek_v3 multi-token prediction: a PP 2 x FSDP 2 checkpoint holds the embedding once and loads in one "
    "process and back",
    "[models][deepseek_v3][mtp][pipeline][checkpoint]") {
  const test::TempDir dir;
  const auto folder = dir.path / "step-1";
  const dist::MeshShape shape{.pp = 2, .dp_shard = 2};
  dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(shape, rank, store, test::kFast);
    const MtpRankPart part(mesh, 7);
    SemiSync outer({}, part.model->unique_parameters());
    outer.start();
    checkpoint::save(folder, part.state(&mesh, &outer), mesh);
  });
  nlohmann::json index;
  std::ifstream(folder / "index.json") >> index;
  REQUIRE(index.at("tensors").contains("model.tok_embeddings.weight"));
  CHECK(index.at("tensors").at("model.tok_embeddings.weight").at("shards").size() == 2);  // FSDP's two, once
  for (const auto& [key, entry] : index.at("tensors").items()) CHECK(key.find("mtp.embedding") == std::string::npos);
  // DiLoCo's outer state of the embedding: once as well, from the first stage.
  for (const char* key :
       {"semi_sync.tok_embeddings.weight.last_sync", "semi_sync.tok_embeddings.weight.momentum_buffer"}) {
    INFO(key);
    REQUIRE(index.at("tensors").contains(key));
    CHECK(index.at("tensors").at(key).at("shards").size() == 2);
  }

  // In one process, over a model initialised from another seed: seed 7's weights, every one.
  const dist::Mesh one;
  const MtpRankPart seven(one, 7);
  const MtpRankPart loaded(one, 8);
  CHECK_FALSE(at::equal(loaded.model->tok_embeddings->weight, seven.model->tok_embeddings->weight));
  checkpoint::State state = loaded.state(nullptr);
  (void)checkpoint::load(folder, state);
  const auto expected = seven.model->named_parameters(/*recurse=*/true);
  int64_t compared = 0;
  for (const auto& item : loaded.model->named_parameters(/*recurse=*/true)) {
    INFO(item.key());
    CHECK(at::equal(item.value(), expected[item.key()]));
    ++compared;
  }
  CHECK(compared == static_cast<int64_t>(expected.size()));

  // Back at PP 2 x FSDP 2 from seed 8: the first stage's embedding and the last stage's copy both seed 7's.
  std::mutex mutex;
  std::vector<at::Tensor> embeddings;  // (V, D) each
  dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(shape, rank, store, test::kFast);
    const MtpRankPart part(mesh, 8);
    checkpoint::State rank_state = part.state(&mesh);
    (void)checkpoint::load(folder, rank_state);
    const at::Tensor embedding = part.embedding(mesh);
    const std::lock_guard lock(mutex);
    embeddings.push_back(embedding);
  });
  REQUIRE(embeddings.size() == 4);
  for (const at::Tensor& e : embeddings) CHECK(at::equal(e, seven.model->tok_embeddings->weight));
}

}  // namespace deepseek_v3_mtp_pipeline_test
