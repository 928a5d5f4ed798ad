// SPDX-License-Identifier: BSD-3-Clause
// Qwen3.5 under FSDP 2, TP 2 (every block's heads split, Gated DeltaNet's included), FSDP 2 x TP 2, CP 2 and 4
// (the Gated DeltaNet state passed from cp rank to cp rank, contiguous shards), PP 2 under every schedule family
// (the zero-bubble ones' split backward included), PP 2 x CP 2, and Qwen3.5-MoE under EP 2, EP 2 x FSDP 2 and
// EP 2 x PP 2 (ranks as threads on the strict backend: NCCL's rules over Gloo) trains as in one process: a small
// Qwen3.5 (three Gated DeltaNet blocks with grouped value heads and 8-token chunks, one gated full-attention block)
// planned from its sharding spec alone, 6 AdamW steps (4 for the pipeline and expert layouts) on 32-token sequences,
// every other step with two documents per row (the recurrence and the convolution restart, RoPE positions per
// document).
//
// Tolerance, 1e-5 relative on losses and grad norms, 1e-5 absolute and relative on every final weight, argued as in
// tests/parallel/user_model_parity_test.cpp: the layouts compute the same fp32 math with sums in another order
// (~1e-7 relative per reduction), and AdamW (lr 1e-3, eps 1e-6) moves an element whose gradient is at rounding level
// by at most lr * dg / eps < 1e-6 per step. A sharding error changes a gradient by its own size: the loss from that
// step, and the weights by up to lr per step.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "models/decoder_train_util.hpp"
#include "test_util.hpp"
#include "titan/models/qwen3_5/model.hpp"

namespace qwen3_5_train_test {
namespace {

using namespace titan;

constexpr int64_t kSteps = 6;
// The pipeline and expert-parallel runs, several layouts a case: a stage split or an expert shard gone wrong shows in
// the first steps' losses, and 4 steps move every weight and expert bias.
constexpr int64_t kShortSteps = 4;
constexpr double kLr = 1e-3;
const test::ParityRun kBatches{.global_batch = 4, .seq_len = 32};

qwen3_5::Qwen35Args small_args() {
  return {.dim = 64,
          .n_layers = 4,
          .n_heads = 4,
          .n_kv_heads = 2,
          .head_dim = 16,
          .vocab_size = 512,
          .hidden_dim = 128,
          .max_seq_len = 64,
          .linear = {.n_key_heads = 2, .n_value_heads = 4, .key_head_dim = 16, .value_head_dim = 16, .chunk_size = 8},
          .tie_word_embeddings = false};
}

// The MoE flavor's layout at this size: 4 routed experts (top 2, softmax, normalised) and the gated shared expert in
// every block, experts of width 32, the load-balancing bias on.
qwen3_5::Qwen35Args small_moe_args() {
  qwen3_5::Qwen35Args args = small_args();
  args.moe_enabled = true;
  args.moe = qwen3_5::moe_flavor("debugmodel_moe").moe;
  args.moe.num_experts = 4;
  args.moe.shared_expert_dim = 32;
  args.moe_inter_dim = 32;
  return args;
}

// What a run varies beside the mesh.
struct Run {
  AcMode checkpoint = AcMode::none;
  PipelineSchedule schedule = PipelineSchedule::schedule_1f1b;
  bool moe = false;  // small_moe_args, the expert biases balanced and returned
  int64_t steps = kSteps;
};

test::NamedRun train_with(const dist::Mesh& mesh, const Run& run) {
  // Contiguous cp shards: the Gated DeltaNet blocks pass their state from each cp rank to the next. Under pp each of
  // the 4 sequences is a microbatch of its own.
  return test::train_decoder<qwen3_5::Qwen35>(
      mesh, run.moe ? small_moe_args() : small_args(),
      {.steps = run.steps,
       .lr = kLr,
       .batches = kBatches,
       .seed = 11,
       .options = {.parallelism = {.pipeline_parallel_schedule = run.schedule,
                                   .context_parallel_load_balancer = std::nullopt},
                   .activation_checkpoint = {.mode = run.checkpoint}},
       .balance_experts = run.moe});
}

test::NamedRun train(const dist::Mesh& mesh) { return train_with(mesh, {}); }

}  // namespace

TEST_CASE("qwen3_5 with Gated DeltaNet blocks trains under FSDP 2 as in one process",
          "[models][qwen3_5][fsdp][parity]") {
  test::check_named_runs({.dp_shard = 2}, train);
}

TEST_CASE("qwen3_5 with Gated DeltaNet heads split over TP 2 trains as in one process",
          "[models][qwen3_5][tp][parity]") {
  test::check_named_runs({.tp = 2}, train);
}

// Context parallelism by state passing: each cp rank continues the previous rank's convolution inputs and delta-rule
// state (the documents of the odd steps cross the cp boundaries at 8, 16 and 24); the full-attention block attends
// across the split with the K/V all-gather.
TEST_CASE("qwen3_5 with Gated DeltaNet state passing trains under CP 2 as in one process",
          "[models][qwen3_5][cp][parity]") {
  test::check_named_runs({.cp = 2}, train);
}

TEST_CASE("qwen3_5 with Gated DeltaNet state passing trains under CP 4 as in one process",
          "[models][qwen3_5][cp][parity]") {
  test::check_named_runs({.cp = 4}, train);
}

// Under full activation checkpointing each block's recompute in backward receives and sends its carry again, in the
// same order on every rank.
TEST_CASE("qwen3_5 with Gated DeltaNet state passing trains under CP 2 with full activation checkpointing",
          "[models][qwen3_5][cp][ac][parity]") {
  test::check_named_runs({.cp = 2},
                         [](const dist::Mesh& mesh) { return train_with(mesh, {.checkpoint = AcMode::full}); });
}

TEST_CASE("qwen3_5 trains under FSDP 2 x TP 2 as in one process", "[models][qwen3_5][tp][fsdp][parity][full]") {
  test::check_named_runs({.dp_shard = 2, .tp = 2}, train);
}

// Pipeline parallelism: the 4 blocks (Gated DeltaNet, Gated DeltaNet, Gated DeltaNet, full attention) split over 2
// ranks, 4 microbatches per step, every schedule family: 1F1B (2 stages), Interleaved 1F1B (4 virtual stages, looped),
// and the zero-bubble schedules whose backward splits into an input pass (the whole graph, the Gated DeltaNet's own
// autograd nodes and its state resets at the odd steps' document starts included, the Linears' weight GEMMs deferred)
// and a weight pass (the deferred GEMMs). Against one process, check_named_ranks' 1e-5: a microbatch's loss sums its
// own tokens, and the gradients add up over the microbatches, in another order than the one process's whole batch.
// Among the schedules the math is the same in the same order: each stage's gradients accumulate microbatch by
// microbatch (the weight pass runs the deferred GEMMs in the order the input pass met them, with the same formula),
// and the loss sums the same microbatches' losses, so every schedule gives 1F1B's losses and weights bitwise. The
// grad norm is each rank's sum of squares over its stages, then summed over pp: a schedule that places the stages
// alike (the looped Interleaved 1F1B and Interleaved zero bubble, the V-shaped ZBV and DualPipeV) gives it bitwise,
// another placement groups the fp32 sum of the ~70 squared per-tensor norms otherwise: at most one rounding of 2^-24
// relative per addition on the sum, half that on its root, < 3e-6 relative.
TEST_CASE(
    "qwen3_5 with Gated DeltaNet blocks trains under PP 2 as in one process with 1F1B and Interleaved 1F1B and "
    "the split-backward zero-bubble schedules",
    "[models][qwen3_5][pp][zb][parity]") {
  const test::NamedRun one = train_with(dist::Mesh(), {.steps = kShortSteps});
  CHECK(one.losses.back() < one.losses.front() - 0.05);  // it trained
  // Each schedule, and the one before it that places the stages alike (itself where none does).
  const std::pair<PipelineSchedule, size_t> schedules[] = {{PipelineSchedule::schedule_1f1b, 0},
                                                           {PipelineSchedule::interleaved_1f1b, 1},
                                                           {PipelineSchedule::interleaved_zero_bubble, 1},
                                                           {PipelineSchedule::zbv_zero_bubble, 3},
                                                           {PipelineSchedule::dual_pipe_v, 3}};
  std::vector<std::vector<test::NamedRun>> runs;
  for (const auto& [schedule, alike] : schedules) {
    INFO(fmt::format("{}", schedule));
    runs.push_back(test::check_named_ranks({.pp = 2}, one, [&](const dist::Mesh& mesh) {
      return train_with(mesh, {.schedule = schedule, .steps = kShortSteps});
    }));
    const size_t i = runs.size() - 1;
    std::map<std::string, at::Tensor> first, these;
    for (size_t rank = 0; rank < 2; ++rank) {
      INFO("rank " << rank);
      const test::NamedRun& got = runs[i][rank];
      CHECK(got.losses == runs[0][rank].losses);
      CHECK(got.grad_norms == runs[alike][rank].grad_norms);
      for (size_t s = 0; s < got.grad_norms.size(); ++s) {
        CHECK(got.grad_norms[s] == Approx(runs[0][rank].grad_norms[s]).epsilon(3e-6));
      }
      first.insert(runs[0][rank].weights.begin(), runs[0][rank].weights.end());
      these.insert(got.weights.begin(), got.weights.end());
    }
    REQUIRE(these.size() == first.size());
    for (const auto& [name, weight] : first) {
      INFO(name);
      CHECK(at::equal(these.at(name), weight));
    }
  }
}

// Context parallelism by state passing inside pipeline stages, under the zero-bubble split: each cp pair of a stage
// passes its blocks' carry forward in the stage's forward and the carry's gradient back in its input pass.
TEST_CASE("qwen3_5 trains under PP 2 x CP 2 with ZBV as in one process", "[models][qwen3_5][pp][cp][zb][parity]") {
  test::check_named_runs({.pp = 2, .cp = 2}, [](const dist::Mesh& mesh) {
    return train_with(mesh, {.schedule = PipelineSchedule::zbv_zero_bubble, .steps = kShortSteps});
  });
}

// Expert parallelism of the MoE flavor: the routed experts split over ep (and FSDP-split again over efsdp when
// dp_shard is 4), tokens exchanged by all-to-all, the shared expert and its gate sharded with the dense weights.
// Each step's expert loads are summed over the dp ranks before the bias moves: the routing is the same on every layout
// (no token's top-2 choice sits within rounding of a tie), so the integer counts, hence the biases, are the one
// process's; they are among the weights checked (1e-5).
TEST_CASE(
    "qwen3_5 MoE with a gated shared expert trains under EP 2 and EP 2 x FSDP 2 and EP 2 x PP 2 as in one process "
    "with expert biases included",
    "[models][qwen3_5][ep][parity]") {
  const auto train_moe = [](const dist::Mesh& mesh) { return train_with(mesh, {.moe = true, .steps = kShortSteps}); };
  const test::NamedRun one = train_moe(dist::Mesh());
  CHECK(one.losses.back() < one.losses.front() - 0.05);  // it trained
  int64_t biases = 0;
  for (const auto& [name, weight] : one.weights) {
    if (!name.ends_with(".expert_bias")) continue;
    ++biases;
    CHECK(weight.abs().max().item<double>() > 0);  // the balancing ran
  }
  CHECK(biases == 4);
  test::check_named_ranks({.dp_shard = 2, .ep = 2}, one, train_moe);
  test::check_named_ranks({.dp_shard = 4, .ep = 2}, one, train_moe);
  // Each stage's ep pair exchanges its own blocks' tokens; each stage balances its own blocks' biases.
  test::check_named_ranks({.pp = 2, .dp_shard = 2, .ep = 2}, one, train_moe);
}

}  // namespace qwen3_5_train_test
