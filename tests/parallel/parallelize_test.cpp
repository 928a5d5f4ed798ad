// SPDX-License-Identifier: BSD-3-Clause
// titan::parallelize: one call applies a whole plan; every misuse is an error naming the thing:
// a plan naming a missing module, a section that is not supported yet, a parameter read around
// with_param, a planned module whose forward skips module_call, a model used after its handle is gone,
// and a model hook spelled wrong (the TrainableModel concept rejects it at compile time).
#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include "parallel/hook_model.hpp"
#include "parity_check.hpp"
#include "test_util.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/layout/module_hooks.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/models/trainable_model.hpp"
#include "titan/nn/layers.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"

using namespace titan;
using test::error_of;
using test::kFast;

namespace {

// A model whose projection is a torch::nn::Linear: it reads its weight directly, not through with_param.
struct RawLinearModel : torch::nn::Module {
  RawLinearModel() : fc(register_module("fc", torch::nn::Linear(8, 8))) {}
  at::Tensor forward(const at::Tensor& x) { return fc->forward(x); }
  torch::nn::Linear fc;
};

// A block named by a TP plan whose forward forgets module_call: the style never runs.
struct ForgetfulBlock : torch::nn::Module {
  ForgetfulBlock() : proj(register_module("proj", std::make_shared<nn::Linear>(8, 8, at::TensorOptions()))) {}
  at::Tensor forward(const at::Tensor& x) const { return proj->forward(x); }  // (B, S, 8) -> (B, S, 8)
  std::shared_ptr<nn::Linear> proj;
};
struct ForgetfulModel : torch::nn::Module {
  ForgetfulModel() : block(register_module("block", std::make_shared<ForgetfulBlock>())) {}
  std::shared_ptr<ForgetfulBlock> block;
};

}  // namespace

TEST_CASE("parallelize applies TP and FSDP in one call and the handle describes both", "[parallel][parallelize]") {
  dist::run_local_ranks(4, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 2, .tp = 2}, rank, store, kFast);
    nn::manual_init_seed(5);
    llama3::Llama3 model(test::parity_args(), 32, at::TensorOptions());
    const Parallelized parallel = parallelize(model, mesh, parallel::plan(model.sharding_spec(), {}, mesh.shape()));
    RANK_CHECK_INFO(parallel.describe(), parallel.describe().find("TP(tp=2") == 0);
    RANK_CHECK_INFO(parallel.describe(), parallel.describe().find("+ FSDP(dp_shard=2)") != std::string::npos);
    // TP shards the rows of wq, FSDP those rows again: a quarter of wq lives here.
    const parallel::ShardedParam* wq =
        parallel::sharded_param(model.layers[0]->attention_as<nn::Attention>()->wq->weight);
    RANK_CHECK(wq != nullptr && wq->placements.size() == 2);
    RANK_CHECK(parallel.loss_parallel());
    model.init_weights();
    const at::Tensor tokens = at::zeros({2, 32}, at::kLong);  // (B, S), the same on every rank
    const at::Tensor logits = model.forward(tokens);          // (B, S, V/tp)
    RANK_CHECK(logits.size(-1) == 512 / 2);
    parallel.cross_entropy_sum(logits, tokens).backward();
    parallel.check_contracts();  // every parameter was read through with_param, every planned module ran
  });
}

TEST_CASE("a plan naming a missing module is an error naming the path, before anything changes",
          "[parallel][parallelize]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2}, rank, store, kFast);
    llama3::Llama3 model(test::parity_args(), 32, at::TensorOptions());
    parallel::ParallelPlan plan = parallel::plan(model.sharding_spec(), {}, mesh.shape());
    plan.tensor_parallel.add("layers.0.attention.wz", parallel::ColwiseParallel{});
    const std::string error = error_of([&] { (void)parallelize(model, mesh, plan); });
    RANK_CHECK_INFO(error, error.find("plan.tensor_parallel path 'layers.0.attention.wz'") != std::string::npos);
    RANK_CHECK(parallel::sharded_param(model.tok_embeddings->weight) == nullptr);  // nothing applied
  });
}

TEST_CASE("an activation-checkpoint path that names no module is a clear error", "[parallel][parallelize][ac]") {
  llama3::Llama3 model(test::parity_args(), 32, at::TensorOptions().device(at::kMeta));
  const dist::Mesh mesh;
  CHECK(error_of([&] {
          (void)parallelize(model, mesh, {.activation_checkpoint = {.modules = {"layers.9"}}});
        }).find("plan.activation_checkpoint.modules path 'layers.9' to name a submodule") != std::string::npos);
}

TEST_CASE("a tp mesh with an empty tensor-parallel plan is an error", "[parallel][parallelize]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2}, rank, store, kFast);
    llama3::Llama3 model(test::parity_args(), 32, at::TensorOptions());
    const std::string error = error_of([&] { (void)parallelize(model, mesh, {}); });
    RANK_CHECK_INFO(error, error.find("got an empty plan") != std::string::npos);
  });
}

TEST_CASE("a parameter read around with_param is reported after the first backward, by name",
          "[parallel][parallelize][contract]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_replicate = 2}, rank, store, kFast);
    auto model = std::make_shared<RawLinearModel>();
    const Parallelized parallel = parallelize(*model, mesh, {.data_parallel = {.units = {{"fc"}}}});
    const at::Tensor loss = model->forward(at::ones({4, 8})).sum();  // ()
    // DDP never saw the gradient: without the check each rank would step on its own gradient.
    const std::string error = error_of([&] { loss.backward(); });
    RANK_CHECK_INFO(error, error.find("'fc.weight', 'fc.bias'") != std::string::npos);
    RANK_CHECK_INFO(error, error.find("with_param") != std::string::npos);
    RANK_CHECK(!error_of([&] { parallel.check_contracts(); }).starts_with("(no error)"));
  });
}

TEST_CASE("a planned module whose forward skips module_call is reported by path", "[parallel][parallelize][contract]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2}, rank, store, kFast);
    ForgetfulModel model;
    parallel::ParallelPlan plan;
    plan.tensor_parallel.add("block", parallel::PrepareModuleInput{.input_layout = parallel::Placement::replicate()})
        .add("block.proj", parallel::ColwiseParallel{.output_layout = parallel::Placement::replicate()});
    const Parallelized parallel = parallelize(model, mesh, plan);
    const at::Tensor out = model.block->forward(at::ones({2, 4, 8}));  // (B, S, 8): proj ran, block's style did not
    const std::string error = error_of([&] { out.sum().backward(); });
    RANK_CHECK_INFO(error, error.find("got 'block' never did") != std::string::npos);
    RANK_CHECK_INFO(error, error.find("block.proj") == std::string::npos);  // proj ran through module_call
  });
}

TEST_CASE("a model used after its parallelize() handle is gone is an error naming the parameter",
          "[parallel][parallelize][lifetime]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 2}, rank, store, kFast);
    nn::manual_init_seed(1);
    llama3::Llama3 model(test::parity_args(), 32, at::TensorOptions());
    {
      const Parallelized parallel = parallelize(model, mesh, parallel::plan(model.sharding_spec(), {}, mesh.shape()));
      model.init_weights();
      RANK_CHECK(model.forward(at::zeros({1, 32}, at::kLong)).size(-1) == 512);  // fine while it lives
    }
    const std::string error = error_of([&] { (void)model.forward(at::zeros({1, 32}, at::kLong)); });
    RANK_CHECK_INFO(error, error.find("'tok_embeddings.weight'") != std::string::npos);
    RANK_CHECK_INFO(error, error.find("Keep the titan::Parallelized handle alive") != std::string::npos);
    // And the model cannot be parallelized a second time.
    const std::string again =
        error_of([&] { (void)parallelize(model, mesh, parallel::plan(model.sharding_spec(), {}, mesh.shape())); });
    RANK_CHECK_INFO(again, again.find("already bound by an earlier parallelize()") != std::string::npos);
  });
}

TEST_CASE("a misspelled model hook fails the TrainableModel concept", "[parallel][parallelize][concept]") {
  STATIC_REQUIRE_FALSE(TrainableModel<test::HookModel<false>>);
  STATIC_REQUIRE(TrainableModel<test::HookModel<true>>);
}
