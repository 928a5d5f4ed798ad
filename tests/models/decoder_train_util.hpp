// SPDX-License-Identifier: BSD-3-Clause
// A registered family's model trained as one rank of a layout sees it, for the families' parity tests
// (test::check_named_runs): the plan from the model's sharding spec and the given options, AdamW steps on
// test::global_batch sequences (each rank's part of its dp rows, its chunks of them under cp), every odd step with two
// documents per row (RoPE positions per document), the whole weights by name at the end (under PP those of the rank's
// stages, each microbatch through the plan's schedule), the expert biases beside them when asked. And the check that a
// sharding spec's FSDP units cover every parameter.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "parallel/parity_check.hpp"
#include "titan/models/multi_token_prediction.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/parallel/context_parallel.hpp"
#include "titan/parallel/expert_parallel.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/mtp_loss.hpp"
#include "titan/train/rank_model.hpp"
#include "titan/train/step.hpp"

namespace titan::test {

/// What train_decoder runs.
template <class Model>
struct DecoderTraining {
  /// Optimizer steps.
  int64_t steps = 6;
  /// AdamW's learning rate (eps 1e-6, weight decay 0.1).
  double lr = 1e-3;
  /// Sequences per step (split over the dp ranks) and their length.
  ParityRun batches{.global_batch = 4, .seq_len = 32};
  /// The init seed.
  uint64_t seed = 11;
  /// The planner's settings beside the model's sharding spec (activation checkpointing, cp's load balancer, ...).
  parallel::PlanOptions options{};
  /// Called once the model is initialised (settings of its own).
  std::function<void(Model&)> prepared{};
  /// Called before each step's forward.
  std::function<void(Model&, int64_t step)> before_step{};
  /// Called after each step's backward, before the optimizer step.
  std::function<void(Model&, int64_t step)> after_backward{};
  /// The trainer's MoE step before the optimizer's: expert loads summed over the ranks, expert biases moved, which
  /// the run then returns beside the weights (by their buffers' names).
  bool balance_experts = false;
};

template <class Model>
NamedRun train_decoder(const dist::Mesh& mesh, const typename Model::Args& args, const DecoderTraining<Model>& t) {
  nn::manual_init_seed(t.seed);
  const auto meta = Model::build(args, {.device = at::kMeta});
  // Multi-token prediction as the Trainer runs it (train/mtp_loss.hpp): each microbatch's labels, under PP its tokens
  // on the last stage, whose copy of the embedding steps as the first stage's. The whole model tells every pp rank.
  const bool mtp = !models::mtp_modules(*meta).empty();
  const parallel::ParallelPlan plan = parallel::plan(meta->sharding_spec(), t.options, mesh.shape());
  // Under PP the rank builds only its stages' modules, with the whole model's names.
  const std::vector<std::string> modules =
      plan.pipeline.stages.empty() ? std::vector<std::string>{} : parallel::pipeline_modules(plan.pipeline, mesh);
  const auto model = Model::build(args, {.device = at::kCPU, .modules = modules});
  const Parallelized parallel = parallelize(*model, mesh, plan);
  model->init_weights();
  if (t.prepared) t.prepared(*model);
  // The plan's expert parallelism, or (ep = 1) the MoE layers recorded, as the trainer's balancing holds them.
  std::optional<parallel::ExpertParallel> moe;
  if (t.balance_experts) {
    moe = parallel.expert_parallel() != nullptr
              ? *parallel.expert_parallel()
              : parallel::apply_expert_parallel(*model, mesh, {.moe_modules = parallel::moe_modules(*model)});
  }
  const std::vector<at::Tensor> params = model->unique_parameters();
  const std::vector<std::string> names = parameter_names(*model, params);
  AdamW optimizer(params, {.lr = t.lr, .eps = 1e-6, .weight_decay = 0.1}, names);
  const StepModel step_model{
      .forward = [&](const at::Tensor& tokens,
                     const nn::AttentionContext& context) { return model->forward(tokens, context); },
      .stage_forward =
          [&](int64_t stage, const at::Tensor& x, const nn::AttentionContext& context) {
            return model->forward_part(x, plan.pipeline.stages[static_cast<size_t>(stage)], context);
          }};
  const int64_t local = t.batches.global_batch / mesh.size("dp");
  const int64_t row = mesh.coordinate("dp") * local;
  const auto rows = [&](const at::Tensor& x) { return x.narrow(0, row, local); };
  const auto [documents, positions] = global_documents(t.batches);  // (B, S) each
  NamedRun out;
  for (int64_t step = 0; step < t.steps; ++step) {
    const auto [input, labels] = global_batch(step, t.batches, model->vocab_size());  // (B, S) each
    const bool packed = step % 2 == 1;
    // Under cp this rank's part of each sequence, and the attention context that says so.
    const parallel::LocalBatch part = parallel.local_batch({.tokens = rows(input),
                                                            .labels = rows(labels),
                                                            .positions = packed ? rows(positions) : at::Tensor(),
                                                            .document_ids = packed ? rows(documents) : at::Tensor()});
    const StepBatch batch{.microbatches = {{part.tokens, part.labels, part.attention}},
                          .tokens = local * t.batches.seq_len,
                          .global_valid_tokens = count_valid_tokens(labels)};
    optimizer.zero_grad();
    if (t.before_step) t.before_step(*model, step);
    const StepModel labelled =
        mtp ? mtp_labelled(step_model, models::mtp_modules(*model), batch, at::kCPU, parallel.pipeline()) : step_model;
    out.losses.push_back(forward_backward(parallel, labelled, batch, mesh, at::kCPU).loss);
    if (mtp) sum_mtp_embedding_grads(*model, parallel.pipeline());
    if (t.after_backward) t.after_backward(*model, step);
    if (moe) {
      moe->update_expert_bias();
      moe->reduce_expert_gradients();
    }
    out.grad_norms.push_back(optimizer_step(optimizer, t.lr, /*max_norm=*/1.0, mesh, mtp_embedding_copies(*model)));
  }
  for (size_t i = 0; i < params.size(); ++i) out.weights[names[i]] = parallel::full_tensor(params[i], mesh);
  if (moe) {
    for (const auto& item : model->named_buffers(/*recurse=*/true)) {
      if (item.key().ends_with(".expert_bias")) out.weights[item.key()] = item.value().clone();
    }
  }
  return out;
}

/// Checks that every parameter of `model` lies under one of `units`' module paths (FSDP then shards all of them).
inline void check_units_cover_parameters(const torch::nn::Module& model,
                                         const std::vector<std::vector<std::string>>& units) {
  for (const auto& item : model.named_parameters()) {
    INFO(item.key());
    CHECK(std::any_of(units.begin(), units.end(), [&](const auto& unit) {
      return std::any_of(unit.begin(), unit.end(),
                         [&](const std::string& m) { return item.key().starts_with(m + "."); });
    }));
  }
}

}  // namespace titan::test
