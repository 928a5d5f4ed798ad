// SPDX-License-Identifier: BSD-3-Clause
// A model type of the tests' own (tests/parallel/gpt2_model.hpp: GPT-2-shaped, no access to the job config) trains
// under FSDP 2 x TP 2 and under TP 2 as in one process: planned from its sharding spec alone, stepped by AdamW with
// no-decay groups for biases, norms and embeddings, through the public step parts a loop of one's own calls.
//
// Tolerance, 1e-5, on losses, grad norms and every final weight (absolute and relative). The layouts compute the
// same fp32 math with sums in another order (each rank sums its tokens and features, the collectives sum the ranks):
// ~1e-7 relative per reduction, so losses and grad norms agree to ~1e-6. AdamW moves an element by lr * m / (sqrt(v)
// + eps), and a gradient that differs by dg moves it differently by at most lr * dg / eps: where the gradient is
// large the ratio hardly changes, but where it is at rounding level it is that level itself (the key bias: a constant
// added to every key leaves the softmax unchanged, so its true gradient is zero and each layout computes its own
// rounding noise, below 1e-9 here). With lr 1e-3 and eps 1e-6 that is < 1e-6 per step, < 6e-6 over the 6 steps. A
// sharding error changes a gradient by its own size, and so the loss from the step it happens and the weights by up
// to lr (1e-3) per step: far outside.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "parallel/gpt2_model.hpp"
#include "parallel/parity_check.hpp"
#include "test_util.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/optim/clip.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/rank_model.hpp"
#include "titan/train/step.hpp"

namespace titan::test {
namespace {

constexpr int64_t kSteps = 6;
constexpr double kLr = 1e-3;
const Gpt2Args kArgs{};
const ParityRun kBatches{.global_batch = 4, .seq_len = 16};

NamedRun train(const dist::Mesh& mesh) {
  nn::manual_init_seed(11);
  // As a loop of one's own: the plan from the model's spec and the mesh's shape, no job config.
  const parallel::ParallelPlan plan =
      parallel::plan(Gpt2::build(kArgs, {.device = at::kMeta})->sharding_spec(), {}, mesh.shape());
  const std::shared_ptr<Gpt2> model = Gpt2::build(kArgs, {.device = at::kCPU});
  const Parallelized parallel = parallelize(*model, mesh, plan);
  model->init_weights();
  const std::vector<at::Tensor> params = model->unique_parameters();
  const std::vector<std::string> names = parameter_names(*model, params);
  AdamW optimizer(params,
                  {.lr = kLr,
                   .eps = 1e-6,
                   .weight_decay = 0.1,
                   .exclude_from_weight_decay = {"bias$", "ln_", "^wte\\.", "^wpe\\."}},
                  names);
  const StepModel step_model{.forward = [&](const at::Tensor& tokens, const nn::AttentionContext& context) {
    return model->forward(tokens, context);
  }};
  const int64_t local = kBatches.global_batch / mesh.size("dp");
  NamedRun out;
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto [input, labels] = global_batch(step, kBatches, kArgs.vocab_size);
    const int64_t row = mesh.coordinate("dp") * local;
    const StepBatch batch{.microbatches = {{input.narrow(0, row, local), labels.narrow(0, row, local)}},
                          .tokens = local * kBatches.seq_len,
                          .global_valid_tokens = count_valid_tokens(labels)};
    optimizer.zero_grad();
    out.losses.push_back(forward_backward(parallel, step_model, batch, mesh, at::kCPU).loss);
    out.grad_norms.push_back(optimizer_step(optimizer, kLr, /*max_norm=*/1.0, mesh));
  }
  for (size_t i = 0; i < params.size(); ++i) out.weights[names[i]] = parallel::full_tensor(params[i], mesh);
  return out;
}

}  // namespace

TEST_CASE(
    "a model of its own with tied head, learned positions, LayerNorm and biases trains under FSDP 2 x TP 2 "
    "as in one process",
    "[parallel][tp][fsdp][parity][user_model]") {
  check_named_runs({.dp_shard = 2, .tp = 2}, train);
}

TEST_CASE(
    "a model of its own with tied head, learned positions, LayerNorm and biases trains under TP 2 as in one "
    "process",
    "[parallel][tp][parity][user_model]") {
  check_named_runs({.tp = 2}, train);
}

}  // namespace titan::test
