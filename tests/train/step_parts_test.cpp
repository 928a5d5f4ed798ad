// SPDX-License-Identifier: BSD-3-Clause
// The step's public parts (train/step.hpp) on one process: pull_microbatches reads the accumulation microbatches
// and counts the batch's valid tokens, forward_backward over the Parallelized handle gives the loss and gradients
// of the plain per-microbatch step, optimizer_step returns the pre-clip norm and clips to max_norm, and a StepModel
// without the forward the layout needs, or no microbatch, is an error naming it. (The layouts: the custom_loop
// launch test, which also holds the parts to the Trainer's losses.)
#include <ATen/ATen.h>

#include <cmath>

#include "test_util.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/job_args.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/loss.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/data_setup.hpp"
#include "titan/train/step.hpp"
#include "train/train_test_util.hpp"

namespace {

using Catch::Contains;

struct Setup {
  titan::test::TempDir dump;
  titan::JobConfig config = titan::test::tinyshakespeare_job(dump.path, /*seq_len=*/32, /*local_batch=*/2,
                                                             /*steps=*/1, /*seed=*/42);
  titan::dist::Mesh mesh;  // one process

  // The debug model, built and initialised alike each call.
  std::shared_ptr<titan::llama3::Llama3> model() const {
    titan::nn::manual_init_seed(42);
    auto m =
        titan::llama3::Llama3::build(titan::models::JobArgs<titan::llama3::Llama3>::make(config), {.device = at::kCPU});
    m->init_weights();
    return m;
  }
};

titan::parallel::ParallelPlan plan_of(const titan::llama3::Llama3& model, const Setup& s) {
  return titan::parallel::plan(model.sharding_spec(), titan::parallel::plan_options(s.config, model, false),
                               s.mesh.shape());
}

double norm_of_grads(const std::vector<at::Tensor>& params) {
  double sum = 0;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) sum += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(sum);
}

}  // namespace

TEST_CASE("Step parts: pull_microbatches and forward_backward give the plain step's loss and gradients",
          "[train][step_parts]") {
  Setup s;
  s.config.training.global_batch_size = 4;  // 2 microbatches of 2 on one rank
  auto model = s.model();
  const titan::Parallelized parallel = titan::parallelize(*model, s.mesh, plan_of(*model, s));
  auto loader = titan::build_dataloader(s.config, titan::build_tokenizer(s.config, model->vocab_size()), 0, 1);
  const int64_t count = titan::gradient_accumulation_steps(s.config, 1);
  REQUIRE(count == 2);

  const titan::StepBatch batch = titan::pull_microbatches(*loader, parallel, s.mesh, count);
  REQUIRE(batch.microbatches.size() == 2);
  int64_t valid = 0;
  for (const titan::Microbatch& mb : batch.microbatches) {
    CHECK(mb.input.sizes() == at::IntArrayRef({2, 32}));
    valid += titan::count_valid_tokens(mb.labels);
  }
  CHECK(batch.tokens == 2 * 2 * 32);
  CHECK(batch.global_valid_tokens == valid);
  CHECK(batch.load_seconds >= 0);

  const titan::StepModel step_model{
      .forward = [&](const at::Tensor& t, const titan::nn::AttentionContext& c) { return model->forward(t, c); }};
  const titan::ForwardBackwardResult fb = titan::forward_backward(parallel, step_model, batch, s.mesh, at::kCPU);
  CHECK(fb.tokens == batch.tokens);
  CHECK(fb.valid_tokens == valid);

  // The same microbatches through the plain overload on a twin model: the same loss and gradients.
  auto twin = s.model();
  const titan::ForwardBackwardResult plain = titan::forward_backward(
      [&](const at::Tensor& t, const titan::nn::AttentionContext& c) { return twin->forward(t, c); },
      batch.microbatches, at::kCPU, batch.global_valid_tokens);
  CHECK(fb.loss == Approx(plain.loss).epsilon(1e-6));
  CHECK(fb.loss > 1.0);  // a token mean of cross-entropy over a vocab of thousands, not a sum or a zero
  const auto params = model->unique_parameters();
  const auto twin_params = twin->unique_parameters();
  REQUIRE(params.size() == twin_params.size());
  for (size_t i = 0; i < params.size(); ++i) CHECK(at::allclose(params[i].grad(), twin_params[i].grad()));

  // optimizer_step: the pre-clip norm, the gradients clipped to max_norm, then the update.
  const double before = norm_of_grads(params);
  const at::Tensor weight = params.front().detach().clone();
  titan::AdamW optimizer(params, s.config.optimizer);
  const double max_norm = before / 4;
  const double norm = titan::optimizer_step(optimizer, /*lr=*/1e-3, max_norm, s.mesh);
  // clip sums fp32 squares, the reference here float64 ones: ~1e-4 apart over millions of gradients.
  CHECK(norm == Approx(before).epsilon(1e-3));
  CHECK(norm_of_grads(params) == Approx(max_norm).epsilon(1e-3));
  CHECK_FALSE(at::equal(params.front(), weight));
}

TEST_CASE("Step parts: a missing forward or no microbatch is an error naming it", "[train][step_parts]") {
  Setup s;
  auto model = s.model();
  const titan::Parallelized parallel = titan::parallelize(*model, s.mesh, plan_of(*model, s));
  auto loader = titan::build_dataloader(s.config, titan::build_tokenizer(s.config, model->vocab_size()), 0, 1);
  CHECK_THROWS_WITH(titan::pull_microbatches(*loader, parallel, s.mesh, 0),
                    Contains("[titan::pull_microbatches] expected at least 1 microbatch, got 0"));
  const titan::StepBatch batch = titan::pull_microbatches(*loader, parallel, s.mesh, 1);
  CHECK_THROWS_WITH(titan::forward_backward(parallel, titan::StepModel{}, batch, s.mesh, at::kCPU),
                    Contains("[titan::forward_backward] expected StepModel::forward, got none"));
}
