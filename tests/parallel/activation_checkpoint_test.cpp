// SPDX-License-Identifier: BSD-3-Clause
// Activation checkpointing: full and selective (every block, every 2nd) against no AC, on one rank,
// FSDP 2 and TP 2 — bitwise (fp32 CPU: the recompute runs the same kernels on the same inputs in the
// same order, and the gradients are accumulated in the same order). Memory falls none > selective 2 >
// full; the recompute replays the forward's RNG state; bad settings are errors naming the key.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <mutex>

#include <torch/csrc/autograd/autograd.h>
#include "alloc_tracker.hpp"
#include "parity_check.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/parallel/activation_checkpoint.hpp"

namespace titan::test {
namespace {

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

// Bytes a debugmodel forward keeps alive until backward (batch 2 x 256 tokens).
int64_t kept_by_forward(AcMode mode, const std::string& option) {
  llama3::Llama3 model(parity_args(), 256, at::TensorOptions());
  nn::manual_init_seed(1);
  model.init_weights();
  parallel::ParallelPlan plan{.activation_checkpoint = llama3::activation_checkpoint_plan(
                                  parity_args(), {.mode = mode, .selective_ac_option = option})};
  const Parallelized applied = parallelize(model, dist::Mesh(), plan);
  const at::Tensor tokens = at::randint(parity_args().vocab_size, {2, 256}, at::kLong);
  TrackAllocations track;
  const at::Tensor logits = model.forward(tokens);
  const int64_t kept = track.stats().live;
  logits.sum().backward();
  return kept;
}

}  // namespace

TEST_CASE("full and selective AC give the losses and weights of no AC bitwise on one rank", "[parallel][ac][parity]") {
  check_bitwise({}, {.ac_mode = AcMode::full});
  check_bitwise({}, {.ac_mode = AcMode::selective, .ac_option = "1"});
  check_bitwise({}, {.ac_mode = AcMode::selective, .ac_option = "2"});
}

TEST_CASE("AC under FSDP 2 and TP 2 gives the losses and weights of no AC bitwise",
          "[parallel][ac][fsdp][tp][parity]") {
  check_bitwise({.dp_shard = 2}, {.ac_mode = AcMode::full});
  check_bitwise({.dp_shard = 2}, {.ac_mode = AcMode::selective, .ac_option = "2"});
  check_bitwise({.tp = 2}, {.ac_mode = AcMode::full});
  check_bitwise({.tp = 2}, {.ac_mode = AcMode::selective, .ac_option = "2"});
}

TEST_CASE("activations kept by the forward fall from no AC to selective to full", "[parallel][ac][memory]") {
  const int64_t none = kept_by_forward(AcMode::none, "2");
  const int64_t every_second = kept_by_forward(AcMode::selective, "2");
  const int64_t full = kept_by_forward(AcMode::full, "2");
  INFO(fmt::format("none {} selective 2 {} full {}", none, every_second, full));
  CHECK(every_second < none);
  CHECK(full < every_second);
  // Full AC keeps each block's input and what lies outside the blocks (embedding output, logits).
  CHECK(full * 3 < none);
}

TEST_CASE("the recompute replays the forward's random draws", "[parallel][ac]") {
  const at::Tensor w = at::randn({16}).requires_grad_(true);
  // A forward that draws: dropout, then a weight.
  const parallel::Recomputable fn = [&](const at::Tensor& in) { return at::dropout(in, 0.5, true) * w; };
  const at::Tensor x = at::randn({8, 16});
  const auto grad_of = [&](bool checkpointed, bool preserve) {
    at::manual_seed(5);
    w.mutable_grad() = at::Tensor();
    const at::Tensor y = checkpointed ? parallel::checkpoint(x, fn, preserve) : fn(x);
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
  CHECK(error_of([&] {
          (void)llama3::activation_checkpoint_plan(args, {.mode = AcMode::selective, .selective_ac_option = "every"});
        }).find("activation_checkpoint.selective_ac_option to be an integer N >= 1") != std::string::npos);
  CHECK(error_of([&] {
          (void)llama3::activation_checkpoint_plan(args, {.mode = AcMode::selective, .selective_ac_option = "0"});
        }).find("got '0'") != std::string::npos);
  CHECK(error_of([&] {
          (void)llama3::activation_checkpoint_plan(args, {.mode = AcMode::memory_budget});
        }).find("activation_checkpoint.mode none, full or selective, got memory_budget") != std::string::npos);
  // torchtitan's counting: selective 2 wraps blocks 2, 4, 6 (layers.1, .3, .5); op checkpoints every block.
  CHECK(llama3::activation_checkpoint_plan(args, {.mode = AcMode::selective, .selective_ac_option = "2"}).modules ==
        std::vector<std::string>{"layers.1", "layers.3", "layers.5"});
  CHECK(llama3::activation_checkpoint_plan(args, {.mode = AcMode::selective, .selective_ac_option = "op"})
            .modules.size() == 6);
  CHECK(llama3::activation_checkpoint_plan(args, {.mode = AcMode::none}).modules.empty());
}

TEST_CASE("a backward restricted to some inputs (zero-bubble's I pass) through AC is refused", "[parallel][ac]") {
  const at::Tensor w = at::randn({4}).requires_grad_(true);
  const at::Tensor x = at::randn({4}).requires_grad_(true);
  const at::Tensor y = parallel::checkpoint(x, [&](const at::Tensor& in) { return in * w; });
  const std::string error = error_of([&] { (void)torch::autograd::grad({y.sum()}, {x}); });
  CHECK(error.find("expected a full backward through a checkpointed module") != std::string::npos);
}

}  // namespace titan::test
