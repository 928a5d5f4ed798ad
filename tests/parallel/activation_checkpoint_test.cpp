// SPDX-License-Identifier: BSD-3-Clause
// Activation checkpointing: full, selective (every block, every 2nd) and per operator against no AC,
// on one rank, FSDP 2 and TP 2 — bitwise (fp32 CPU: the recompute runs the same kernels on the same
// inputs in the same order, a kept op's backward runs the kernels the plain op's does, and the
// gradients are accumulated in the same order). Memory falls none > selective 2 > op > full; per-op
// AC runs fewer matmuls in backward than full AC; the recompute replays the forward's RNG state; bad
// settings are errors naming the key.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <atomic>
#include <mutex>

#include <ATen/record_function.h>

#include <torch/csrc/autograd/autograd.h>
#include "alloc_tracker.hpp"
#include "parity_check.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/nn/saved_ops.hpp"
#include "titan/parallel/activation_checkpoint.hpp"
#include "titan/parallel/planner.hpp"

namespace titan::test {
namespace {

// The blocks activation checkpointing may wrap, as the model declares them.
std::vector<std::string> blocks_of(const llama3::Llama3Args& args) {
  return llama3::Llama3(args, 32, at::TensorOptions().device(at::kMeta)).sharding_spec().blocks;
}

// Losses, grad norms and final weights of `run` on `shape`, per rank, with and without AC.
void check_bitwise(const dist::MeshShape& shape, const ParityRun& with_ac) {
  ParityRun without = with_ac;
  without.ac_mode = AcMode::none;
  std::mutex mutex;
  std::vector<std::pair<ParityResult, ParityResult>> results(static_cast<size_t>(shape.world_size()));
  dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(shape, rank, store, kFast);
    ParityResult plain = train_parity(mesh, without);
    // The handle outlives train_parity's model: drop it before the next model is built, whose modules
    // may land at the dead ones' addresses, still keys of that handle's state.
    plain.applied = Parallelized();
    ParityResult checkpointed = train_parity(mesh, with_ac);
    std::lock_guard lock(mutex);
    results[static_cast<size_t>(rank)] = {std::move(plain), std::move(checkpointed)};
  });
  for (size_t rank = 0; rank < results.size(); ++rank) {
    const auto& [plain, ac] = results[rank];
    INFO(fmt::format("{} rank {} mode {} option {}", shape, rank, with_ac.ac_mode, with_ac.ac_option));
    CHECK(ac.losses == plain.losses);
    CHECK(ac.grad_norms == plain.grad_norms);
    REQUIRE(ac.weights.size() == plain.weights.size());
    for (size_t i = 0; i < ac.weights.size(); ++i) CHECK(at::equal(ac.weights[i], plain.weights[i]));
  }
}

struct ForwardBackward {
  int64_t kept = 0;              // bytes the forward keeps alive until backward
  int64_t backward_matmuls = 0;  // aten::mm calls during backward (the recompute's and the gradients')
};

// A debugmodel forward and backward (batch 2 x 256 tokens) under `mode`.
ForwardBackward forward_backward(AcMode mode, const std::string& option) {
  llama3::Llama3 model(parity_args(), 256, at::TensorOptions());
  nn::manual_init_seed(1);
  model.init_weights();
  parallel::ParallelPlan plan{.activation_checkpoint = parallel::activation_checkpoint_plan(
                                  blocks_of(parity_args()), {.mode = mode, .selective_ac_option = option}, false)};
  const Parallelized applied = parallelize(model, dist::Mesh(), plan);
  const at::Tensor tokens = at::randint(parity_args().vocab_size, {2, 256}, at::kLong);
  ForwardBackward result;
  at::Tensor logits;
  {
    TrackAllocations track;
    logits = model.forward(tokens);
    result.kept = track.stats().live;
  }
  static std::atomic<int64_t> matmuls{0};
  matmuls = 0;
  const at::CallbackHandle counter = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (std::string_view(fn.name()) == "aten::mm") ++matmuls;
        return nullptr;
      }));
  logits.sum().backward();
  at::removeCallback(counter);
  result.backward_matmuls = matmuls;
  return result;
}

}  // namespace

// Bitwise from the first step on, so 6 steps (the optimizer's state included) say what 20 would.
constexpr int64_t kBitwiseSteps = 6;

TEST_CASE("full and selective AC give the losses and weights of no AC bitwise on one rank", "[parallel][ac][parity]") {
  check_bitwise({}, {.steps = kBitwiseSteps, .ac_mode = AcMode::full});
  check_bitwise({}, {.steps = kBitwiseSteps, .ac_mode = AcMode::selective, .ac_option = "1"});
  check_bitwise({}, {.steps = kBitwiseSteps, .ac_mode = AcMode::selective, .ac_option = "2"});
  check_bitwise({}, {.steps = kBitwiseSteps, .ac_mode = AcMode::selective, .ac_option = "op"});
}

TEST_CASE("AC under FSDP 2 and TP 2 gives the losses and weights of no AC bitwise",
          "[parallel][ac][fsdp][tp][parity][full]") {
  for (const dist::MeshShape shape : {dist::MeshShape{.dp_shard = 2}, dist::MeshShape{.tp = 2}}) {
    check_bitwise(shape, {.steps = kBitwiseSteps, .ac_mode = AcMode::full});
    check_bitwise(shape, {.steps = kBitwiseSteps, .ac_mode = AcMode::selective, .ac_option = "1"});
    check_bitwise(shape, {.steps = kBitwiseSteps, .ac_mode = AcMode::selective, .ac_option = "2"});
    check_bitwise(shape, {.steps = kBitwiseSteps, .ac_mode = AcMode::selective, .ac_option = "op"});
  }
}

TEST_CASE("AC under PP 2 and CP 2 and with document masks gives the losses and weights of no AC bitwise",
          "[parallel][ac][pp][cp][parity][full]") {
  const ParityRun base{.steps = kBitwiseSteps, .documents = true};
  for (const std::string option : {"op", "2"}) {
    ParityRun selective = base;
    selective.ac_mode = AcMode::selective;
    selective.ac_option = option;
    check_bitwise({}, selective);  // one device: the kept attention takes the document mask as SDPA does
    check_bitwise({.cp = 2}, selective);
  }
  ParityRun full = base;
  full.ac_mode = AcMode::full;
  check_bitwise({.pp = 2}, full);
  check_bitwise({.cp = 2}, full);
  ParityRun per_op = base;
  per_op.ac_mode = AcMode::selective;
  per_op.ac_option = "op";
  check_bitwise({.pp = 2}, per_op);
}

TEST_CASE("activations kept by the forward fall from no AC to selective to per op to full", "[parallel][ac][memory]") {
  const ForwardBackward none = forward_backward(AcMode::none, "2");
  const ForwardBackward every_second = forward_backward(AcMode::selective, "2");
  const ForwardBackward per_op = forward_backward(AcMode::selective, "op");
  const ForwardBackward full = forward_backward(AcMode::full, "2");
  INFO(fmt::format("kept: none {} selective 2 {} op {} full {}", none.kept, every_second.kept, per_op.kept, full.kept));
  CHECK(every_second.kept < none.kept);
  CHECK(per_op.kept < every_second.kept);
  CHECK(full.kept < per_op.kept);
  // Full AC keeps each block's input and what lies outside the blocks (embedding output, logits).
  CHECK(full.kept * 3 < none.kept);
  // Full AC's recompute runs each block's 7 matmuls again; per op keeps 4 of them (wq, wv, w1, w2 by
  // torchtitan's count) and recomputes 3.
  INFO(fmt::format("backward matmuls: none {} op {} full {}", none.backward_matmuls, per_op.backward_matmuls,
                   full.backward_matmuls));
  CHECK(full.backward_matmuls - none.backward_matmuls == 7 * parity_args().n_layers);
  CHECK(per_op.backward_matmuls - none.backward_matmuls == 3 * parity_args().n_layers);
}

TEST_CASE("a per-op policy's forced recompute runs those matmuls again", "[parallel][ac]") {
  // One Linear, checkpointed per op: its matmul (the 1st) is kept unless forced.
  auto linear = std::make_shared<nn::Linear>(8, 4, at::TensorOptions());
  {
    const at::NoGradGuard no_grad;
    linear->weight.normal_();
  }
  const at::Tensor x = at::randn({3, 5, 8}).requires_grad_(true);
  const auto run = [&](bool forced) {
    auto policy = std::make_shared<nn::SavedOpPolicy>();
    if (forced) policy->force_recompute.insert(linear.get());
    nn::SavedOps probe(policy);
    const parallel::Recomputable fn = [&](const at::Tensor& in) { return at::relu(linear->forward(in)); };
    const at::Tensor y = parallel::checkpoint(x, fn, {.per_op = policy});
    {
      const at::NoGradGuard no_grad;
      const nn::SavedOpsScope record(probe, nn::SavedOpsScope::Phase::record);
      (void)fn(x);
    }
    x.mutable_grad() = at::Tensor();
    linear->weight.mutable_grad() = at::Tensor();
    y.pow(2).sum().backward();
    return std::tuple{probe.kept_bytes(), x.grad().clone(), linear->weight.grad().clone()};
  };
  const auto [kept, dx, dw] = run(false);
  const auto [forced_kept, forced_dx, forced_dw] = run(true);
  CHECK(kept == 3 * 5 * 4 * static_cast<int64_t>(sizeof(float)));
  CHECK(forced_kept == 0);
  at::Tensor plain_x = x.detach().requires_grad_(true);
  linear->weight.mutable_grad() = at::Tensor();
  at::relu(linear->forward(plain_x)).pow(2).sum().backward();
  CHECK(at::equal(dx, plain_x.grad()));
  CHECK(at::equal(dw, linear->weight.grad()));
  CHECK(at::equal(forced_dx, dx));
  CHECK(at::equal(forced_dw, dw));
}

TEST_CASE("the recompute replays the forward's random draws", "[parallel][ac]") {
  const at::Tensor w = at::randn({16}).requires_grad_(true);
  // A forward that draws: dropout, then a weight.
  const parallel::Recomputable fn = [&](const at::Tensor& in) { return at::dropout(in, 0.5, true) * w; };
  const at::Tensor x = at::randn({8, 16});
  const auto grad_of = [&](bool checkpointed, bool preserve) {
    at::manual_seed(5);
    w.mutable_grad() = at::Tensor();
    const at::Tensor y = checkpointed ? parallel::checkpoint(x, fn, {.preserve_rng_state = preserve}) : fn(x);
    at::randn({100});  // draws between forward and backward must not change the recompute's mask
    y.sum().backward();
    return w.grad().clone();
  };
  const at::Tensor plain = grad_of(false, true);
  CHECK(at::equal(grad_of(true, true), plain));
  CHECK_FALSE(at::equal(grad_of(true, false), plain));  // without the replay the mask differs
}

TEST_CASE("AC settings that cannot run are errors naming the key", "[parallel][ac]") {
  const auto args = parity_args();
  const auto blocks = blocks_of(args);
  CHECK(error_of([&] {
          (void)parallel::activation_checkpoint_plan(
              blocks, {.mode = AcMode::selective, .selective_ac_option = "every"}, false);
        }).find("activation_checkpoint.selective_ac_option to be an integer N >= 1") != std::string::npos);
  CHECK(error_of([&] {
          (void)parallel::activation_checkpoint_plan(blocks, {.mode = AcMode::selective, .selective_ac_option = "0"},
                                                     false);
        }).find("got '0'") != std::string::npos);
  CHECK(error_of([&] {
          (void)parallel::activation_checkpoint_plan(blocks, {.mode = AcMode::memory_budget}, false);
        }).find("activation_checkpoint.mode none, full or selective, got memory_budget") != std::string::npos);
  // torchtitan's counting: selective 2 wraps blocks 2, 4, 6 (layers.1, .3, .5); op checkpoints every block.
  CHECK(parallel::activation_checkpoint_plan(blocks, {.mode = AcMode::selective, .selective_ac_option = "2"}, false)
            .modules == std::vector<std::string>{"layers.1", "layers.3", "layers.5"});
  const parallel::ActivationCheckpointPlan per_op =
      parallel::activation_checkpoint_plan(blocks, {.mode = AcMode::selective, .selective_ac_option = "op"}, false);
  CHECK(per_op.modules.size() == 6);
  CHECK(per_op.per_op);
  CHECK(per_op.force_recompute_mm.empty());  // torchtitan's default names a MoE router: nothing in Llama
  // A force-recompute entry must name Linear modules of the model.
  const auto parallelize_with = [&](std::vector<std::string> fqns) {
    llama3::Llama3 model(args, 64, at::TensorOptions());
    parallel::ParallelPlan plan{.activation_checkpoint = parallel::activation_checkpoint_plan(
                                    blocks,
                                    {.mode = AcMode::selective,
                                     .selective_ac_option = "op",
                                     .per_op_sac_force_recompute_mm_shapes_by_fqns = std::move(fqns)},
                                    false)};
    return error_of([&] { (void)parallelize(model, dist::Mesh(), plan); });
  };
  CHECK(parallelize_with({"feed_forward.w9"})
            .find("force_recompute_mm entry 'feed_forward.w9' to match a module path of") != std::string::npos);
  CHECK(parallelize_with({"feed_forward"}).find("to match Linear modules, got 'layers.0.feed_forward'") !=
        std::string::npos);
  CHECK(parallelize_with({"feed_forward.w2"}) == "(no error)");
  CHECK(parallel::activation_checkpoint_plan(blocks, {.mode = AcMode::none}, false).modules.empty());
}

// Zero-bubble under AC: the checkpointed blocks recompute once, in the I pass, and leave their weight
// GEMMs (on the recomputed inputs) to the W pass; 3 steps, each schedule under one AC mode, ranks as threads.
constexpr int64_t kZeroBubbleSteps = 3;

TEST_CASE("ZBV on pp 2 under full AC gives the losses and weights of no AC bitwise",
          "[parallel][ac][pipeline][zb][parity]") {
  check_bitwise({.pp = 2},
                {.steps = kZeroBubbleSteps, .schedule = PipelineSchedule::zbv_zero_bubble, .ac_mode = AcMode::full});
}

TEST_CASE("Interleaved zero bubble on pp 2 under selective AC (every 2nd block) gives no AC's bits",
          "[parallel][ac][pipeline][zb][parity]") {
  check_bitwise({.pp = 2}, {.steps = kZeroBubbleSteps,
                            .schedule = PipelineSchedule::interleaved_zero_bubble,
                            .ac_mode = AcMode::selective,
                            .ac_option = "2"});
}

TEST_CASE("DualPipeV on pp 2 under per-operator AC gives no AC's bits", "[parallel][ac][pipeline][zb][parity]") {
  check_bitwise({.pp = 2}, {.steps = kZeroBubbleSteps,
                            .schedule = PipelineSchedule::dual_pipe_v,
                            .ac_mode = AcMode::selective,
                            .ac_option = "op"});
}

TEST_CASE("a backward restricted to some inputs (autograd::grad) through AC is refused", "[parallel][ac]") {
  const at::Tensor w = at::randn({4}).requires_grad_(true);
  const at::Tensor x = at::randn({4}).requires_grad_(true);
  const at::Tensor y = parallel::checkpoint(x, [&](const at::Tensor& in) { return in * w; });
  const std::string error = error_of([&] { (void)torch::autograd::grad({y.sum()}, {x}); });
  CHECK(error.find("expected a full backward through a checkpointed module") != std::string::npos);
}

}  // namespace titan::test
