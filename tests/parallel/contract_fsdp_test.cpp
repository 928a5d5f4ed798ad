// SPDX-License-Identifier: BSD-3-Clause
// A layer that reads a parameter around with_param under FSDP sees only this rank's shard and fails inside ATen in
// the first forward; the step's forward (Parallelized::run_forward) reports it as clearly as the first backward does
// under DDP: naming the parameter, its shard and whole shapes, and with_param.
#include <ATen/ATen.h>

#include "parallel/parity_check.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/nn/layers.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/train/step.hpp"

using namespace titan;
using test::error_of;

namespace {

// A scale whose forward multiplies by its weight directly, not through with_param.
struct DirectScale : torch::nn::Module {
  DirectScale() : weight(register_parameter("weight", at::ones({8}))) {}
  at::Tensor forward(const at::Tensor& x) const { return x * weight; }  // (..., 8)
  at::Tensor weight;                                                    // (8)
};

struct Model : torch::nn::Module {
  Model()
      : proj(register_module("proj", std::make_shared<nn::Linear>(8, 8, at::TensorOptions()))),
        scale(register_module("scale", std::make_shared<DirectScale>())) {}
  at::Tensor forward(const at::Tensor& x) const { return scale->forward(proj->forward(x)); }  // (B, S, 8)
  std::shared_ptr<nn::Linear> proj;    // weight (8, 8), read through with_param
  std::shared_ptr<DirectScale> scale;  // weight (8), read directly
};

}  // namespace

TEST_CASE("a parameter read around with_param under FSDP is named by the first forward's error",
          "[parallel][parallelize][contract][fsdp]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 2}, rank, store, test::kFast);
    Model model;
    const Parallelized parallel = parallelize(model, mesh, {.data_parallel = {.units = {{"proj"}, {"scale"}}}});
    const at::Tensor x = at::ones({2, 4, 8});  // (B, S, 8)
    // Without the step's boundary ATen speaks of sizes only.
    const std::string raw = error_of([&] { (void)model.forward(x); });
    RANK_CHECK_INFO(raw, raw.find("scale.weight") == std::string::npos);
    const std::string error = error_of([&] { (void)parallel.run_forward([&] { return model.forward(x); }); });
    RANK_CHECK_INFO(error, error.find("'scale.weight' (4) of (8)") != std::string::npos);
    RANK_CHECK_INFO(error, error.find("with_param") != std::string::npos);
    RANK_CHECK_INFO(error, error.find("proj.weight") == std::string::npos);  // it was read through with_param
    // titan::forward_backward runs the forward through it.
    const StepModel step{.forward = [&](const at::Tensor& tokens, const nn::AttentionContext&) {
      return model.forward(tokens.to(at::kFloat).unsqueeze(-1).expand({-1, -1, 8}));
    }};
    const at::Tensor tokens = at::zeros({1, 4}, at::kLong);  // (B, S)
    const StepBatch batch{.microbatches = {{tokens, tokens}}, .tokens = 4, .global_valid_tokens = 8};
    const std::string stepped = error_of([&] { (void)forward_backward(parallel, step, batch, mesh, at::kCPU); });
    RANK_CHECK_INFO(stepped, stepped.find("'scale.weight'") != std::string::npos);
  });
}

TEST_CASE("run_forward passes a forward's own errors through once the contract has passed",
          "[parallel][parallelize][contract]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 2}, rank, store, test::kFast);
    nn::Linear model(8, 8, at::TensorOptions());
    const Parallelized parallel = parallelize(model, mesh, {.data_parallel = {.units = {}}});
    parallel.run_forward([&] { return model.forward(at::ones({2, 8})); }).sum().backward();
    parallel.check_contracts();
    // A shape error of the caller's own: no parameter is blamed.
    const std::string error = error_of([&] {
      (void)parallel.run_forward([&] { return model.forward(at::ones({2, 7})); });
    });
    RANK_CHECK_INFO(error, error.find("with_param") == std::string::npos);
  });
}
