// SPDX-License-Identifier: BSD-3-Clause
// What parallelize() attaches to a model (parameter bindings, tensor-parallel hooks, checkpoint marks) is
// found by address, under one lifetime rule (src/layout/attachments.hpp). The test builds a model whose
// modules live at fixed addresses, parallelizes it under TP + AC + FSDP, drops it while its handle lives,
// rebuilds it at the same addresses and requires the newcomer to see nothing of the old plan; then
// parallelizes the newcomer and requires the old handle's late teardown to leave the new plan in place.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include <cstddef>
#include <memory>
#include <new>

#include "parity_check.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/layout/module_hooks.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/nn/layers.hpp"
#include "titan/parallel/activation_checkpoint.hpp"
#include "titan/parallel/parallelize.hpp"

using namespace titan;

namespace {

// Storage the modules are built in, so a rebuilt model occupies exactly the old addresses.
struct Arena {
  alignas(std::max_align_t) std::byte block[512];
  alignas(std::max_align_t) std::byte proj[512];
};

// A shared_ptr to an object built in `slot`, with its own control block: the object's death frees the
// address at once (make_shared would keep it while a weak reference lives).
template <class T, class... Args>
std::shared_ptr<T> build_in(std::byte* slot, Args&&... args) {
  static_assert(sizeof(T) <= sizeof(Arena::block));
  return std::shared_ptr<T>(new (slot) T(std::forward<Args>(args)...), [](T* t) { t->~T(); });
}

struct Block : torch::nn::Module {
  explicit Block(Arena& arena)
      : proj(register_module("proj", build_in<nn::Linear>(arena.proj, 8, 8, at::TensorOptions()))) {}
  at::Tensor forward(const at::Tensor& x) const {  // (B, 8) -> (B, 8), or (B, 8/tp) under the plan
    return parallel::checkpoint_call(*this, x, [this](const at::Tensor& in) { return proj->forward(in); });
  }
  std::shared_ptr<nn::Linear> proj;  // weight (8, 8): Shard(0) on tp, then on dp_shard
};

struct Net : torch::nn::Module {
  explicit Net(Arena& arena) : block(register_module("block", build_in<Block>(arena.block, arena))) {}
  std::shared_ptr<Block> block;
};

parallel::ParallelPlan plan() {
  parallel::ParallelPlan p;
  p.tensor_parallel.add("block.proj", parallel::ColwiseParallel{});
  p.activation_checkpoint.modules = {"block"};
  p.data_parallel.units = {{"block"}};
  return p;
}

bool checkpointed(const at::Tensor& y) {
  return y.grad_fn() != nullptr && y.grad_fn()->name() == "titan::CheckpointBackward";
}

}  // namespace

TEST_CASE("a model rebuilt at the addresses of a dropped one sees nothing of the old plan under TP, AC and FSDP",
          "[parallel][parallelize][attachments]") {
  dist::run_local_ranks(4, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 2, .tp = 2}, rank, store, test::kFast);
    Arena arena;
    const at::Tensor x = at::randn({3, 8}, at::TensorOptions().requires_grad(true));  // (B, 8)

    auto old_model = std::make_shared<Net>(arena);
    auto old_handle = std::make_unique<Parallelized>(parallelize(*old_model, mesh, plan()));
    RANK_CHECK(parallel::detail::find_module_hook(old_model->block->proj.get()) != nullptr);
    RANK_CHECK(checkpointed(old_model->block->forward(x)));
    const void* old_block = old_model->block.get();
    const void* old_proj = old_model->block->proj.get();
    old_model.reset();  // the handle outlives its model: its entries stand, their subjects are gone

    auto model = std::make_shared<Net>(arena);
    RANK_CHECK(static_cast<const void*>(model->block.get()) == old_block);
    RANK_CHECK(static_cast<const void*>(model->block->proj.get()) == old_proj);
    RANK_CHECK(parallel::detail::find_module_hook(model->block->proj.get()) == nullptr);
    RANK_CHECK(parallel::sharded_param(model->block->proj->weight) == nullptr);
    {
      at::NoGradGuard no_grad;
      model->block->proj->weight.normal_();  // built with at::empty: values to compare, not whatever the memory held
    }
    at::Tensor y = model->block->forward(x);  // (B, 8): the plain layer, no style, no recompute
    RANK_CHECK(!checkpointed(y));
    RANK_CHECK(at::allclose(y, at::linear(x, model->block->proj->weight, model->block->proj->bias)));

    // The newcomer's own plan, then the old handle's late teardown: the new entries stay.
    const Parallelized handle = parallelize(*model, mesh, plan());
    old_handle.reset();
    RANK_CHECK(parallel::detail::find_module_hook(model->block->proj.get()) != nullptr);
    const parallel::ShardedParam* weight = parallel::sharded_param(model->block->proj->weight);
    RANK_CHECK(weight != nullptr && weight->placements.size() == 2);
    y = model->block->forward(x);  // (B, 8/tp): colwise keeps the local columns
    RANK_CHECK(checkpointed(y));
    RANK_CHECK(y.size(-1) == 4);
    y.sum().backward();
    handle.check_contracts();
  });
}

TEST_CASE("a module a plan names must be held by a shared_ptr, and the error names its path",
          "[parallel][parallelize][attachments]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2}, rank, store, test::kFast);
    nn::Linear proj(8, 8, at::TensorOptions());  // on the stack: nothing can tell when it dies
    parallel::ParallelPlan p;
    p.tensor_parallel.add("", parallel::ColwiseParallel{});
    const std::string error = test::error_of([&] { (void)parallelize(proj, mesh, p); });
    RANK_CHECK_INFO(error, error.find("expected module '<root>' to be held by a std::shared_ptr") != std::string::npos);
  });
}
