// SPDX-License-Identifier: BSD-3-Clause
// Trains debugmodel-shaped Llama 3 on one rank of a mesh with fixed global batches, so parallel
// layouts can be compared with one rank step by step.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/core/config.hpp"
#include "titan/dist/functional.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/float8/converter.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/loss.hpp"
#include "titan/optim/clip.hpp"
#include "titan/optim/muon.hpp"
#include "titan/parallel/context_parallel.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/rank_model.hpp"
#include "titan/train/step.hpp"

namespace titan::test {

inline constexpr double kParityLr = 1e-3;

struct ParityRun {
  int64_t steps = 8;                                            ///< optimizer steps
  int64_t global_batch = 8;                                     ///< sequences per step, split over dp ranks
  int64_t seq_len = 64;                                         ///< tokens per sequence
  int64_t accumulation = 1;                                     ///< microbatches per rank per step
  ReshardAfterForward reshard = ReshardAfterForward::default_;  ///< fsdp_reshard_after_forward
  parallel::DataParallelCollectives collectives =
      parallel::DataParallelCollectives::auto_;  ///< FSDP/DDP collective layout
  bool trace = false;                            ///< record the FSDP event trace
  bool sequence_parallel = true;                 ///< under TP: sequence-sharded activations between blocks
  bool loss_parallel = true;                     ///< under TP: loss on vocab-sharded logits
  bool async_tp = false;                         ///< under TP: collectives overlapped over batch chunks
  PipelineSchedule schedule = PipelineSchedule::schedule_1f1b;  ///< under PP: the schedule
  std::string schedule_csv{};                                   ///< under PP: a CSV schedule instead
  int64_t layers_per_stage = 0;                                 ///< under PP: 0 = the schedule's default split
  bool overlap_f_b = true;   ///< under PP: DualPipeV's F/B pairs at once (pipeline_parallel_expert_parallel_overlap)
  bool load_balance = true;  ///< under CP: headtail chunks (else contiguous)
  CpRotateMethod rotate = CpRotateMethod::allgather;  ///< under CP: the K/V exchange
  bool documents = false;          ///< two documents per row: document masking and per-document positions
  AcMode ac_mode = AcMode::none;   ///< activation checkpointing (activation_checkpoint.mode)
  bool bf16 = false;               ///< mixed precision: FSDP/DDP gather bf16 (fp32 reduce), one rank autocasts
  std::string ac_option = "2";     ///< activation_checkpoint.selective_ac_option
  bool float8 = false;             ///< float8 tensorwise Linears (the converter, output kept high precision)
  bool float8_all_gather = false;  ///< with float8 under FSDP: all-gather the float8 weights in float8
  bool float8_precompute = false;  ///< with float8_all_gather: one amax all-reduce per step
  OptimizerName optimizer = OptimizerName::adamw;  ///< AdamW, or Muon (its matrices at kParityLr too)
  int64_t first_step = 0;                          ///< the step to start at (a resumed run: the load's)
  std::string load{};                              ///< a checkpoint folder to load before the first step
  std::string save{};                              ///< a checkpoint folder to save to after the last step
};

struct ParityResult {
  std::vector<double> losses;       ///< global loss per step
  std::vector<double> grad_norms;   ///< global grad norm per step
  std::vector<at::Tensor> weights;  ///< whole parameters after the last step (unique_parameters order)
  std::vector<std::string> names;   ///< FQN of each of weights (a pipeline rank: its stages' only)
  int64_t local_state_bytes = 0;    ///< this rank's params + grads + optimizer state
  Parallelized applied;             ///< the model's parallel state (alive with the result)
};

inline llama3::Llama3Args parity_args() {
  llama3::Llama3Args args = llama3::flavor("debugmodel");
  // debugmodel's 6 blocks (the pipeline splits) at a quarter of its width: 4 heads of 16 (tp 2 and 4
  // divide heads and KV heads), FFN 256, a 512-token vocabulary (the loss curve is what matters, not the
  // vocabulary). A sharding error shows at step 1-2 at any width; debugmodel's dim 256 took 3x the time.
  args.vocab_size = 512;
  args.dim = 64;
  args.n_heads = 4;
  return args;
}

/// The global batch of a step: the same on every rank (rank-independent generator).
inline std::pair<at::Tensor, at::Tensor> global_batch(int64_t step, const ParityRun& run, int64_t vocab) {
  // Learnable sequences: arithmetic progressions mod vocab, random start and stride 1..4.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  const at::Tensor start = at::randint(vocab, {run.global_batch, 1}, gen, at::kLong);  // (B, 1)
  const at::Tensor stride = at::randint(1, 5, {run.global_batch, 1}, gen, at::kLong);  // (B, 1)
  const at::Tensor t = at::arange(run.seq_len + 1, at::kLong).unsqueeze(0);            // (1, S+1)
  at::Tensor tokens = (start + stride * t).remainder(vocab);                           // (B, S+1)
  at::Tensor labels = tokens.narrow(1, 1, run.seq_len).clone();                        // (B, S)
  labels.narrow(0, 0, 1).narrow(1, 0, 5).fill_(kIgnoreIndex);  // uneven valid tokens across ranks
  return {tokens.narrow(1, 0, run.seq_len).contiguous(), labels};
}

/// Two documents per row, split at a row-dependent point: (document ids, per-document positions), (B, S).
inline std::pair<at::Tensor, at::Tensor> global_documents(const ParityRun& run) {
  const at::Tensor t = at::arange(run.seq_len, at::kLong).unsqueeze(0);  // (1, S)
  const at::Tensor split =
      (at::arange(run.global_batch, at::kLong) * 7 % (run.seq_len - 8) + 4).unsqueeze(1);  // (B, 1)
  const at::Tensor ids = (t >= split).to(at::kLong);                                       // (B, S)
  return {ids, t - ids * split};
}

/// The whole parameter behind p (all-gathered over every axis it is sharded on).
inline at::Tensor whole(const at::Tensor& p, const dist::Mesh& mesh) { return parallel::full_tensor(p, mesh); }

/// The parity model on one rank of `mesh`: sharded by the plan the Trainer would make, initialised from the seed
/// (every layout starts from the same weights).
struct ParityModel {
  std::shared_ptr<llama3::Llama3> model;        ///< this rank's part (under PP its stages)
  parallel::ParallelPlan plan;                  ///< the plan applied
  Parallelized applied;                         ///< the model's parallel state
  std::vector<at::Tensor> params;               ///< unique_parameters
  std::vector<std::string> names;               ///< FQN of each of params
  std::vector<std::string> embedding_and_head;  ///< the spec's embedding and head modules (AdamW's under Muon)
};

inline ParityModel parity_model(const dist::Mesh& mesh, const ParityRun& run) {
  nn::manual_init_seed(42);
  // Under PP the rank builds only its stages' modules.
  // The plan, as the Trainer makes it: from the whole model's spec (shapes only) and the run's settings, before
  // the rank builds its part (under PP only its stages' modules).
  const parallel::ShardingSpec spec =
      llama3::Llama3(parity_args(), run.seq_len, at::TensorOptions().device(at::kMeta)).sharding_spec();
  ParityModel m;
  m.embedding_and_head = titan::detail::embedding_and_head_modules(spec);
  m.plan = parallel::plan(
      spec,
      {.parallelism = {.pipeline_parallel_layers_per_stage =
                           run.layers_per_stage > 0 ? std::optional<int64_t>(run.layers_per_stage) : std::nullopt,
                       .pipeline_parallel_schedule = run.schedule,
                       .pipeline_parallel_schedule_csv = run.schedule_csv,
                       .pipeline_parallel_expert_parallel_overlap = run.overlap_f_b},
       .activation_checkpoint = {.mode = run.ac_mode, .selective_ac_option = run.ac_option}},
      mesh.shape());
  parallel::ParallelPlan& plan = m.plan;
  const std::vector<std::string> modules =
      plan.pipeline.stages.empty() ? std::vector<std::string>{} : parallel::pipeline_modules(plan.pipeline, mesh);
  m.model = std::make_shared<llama3::Llama3>(parity_args(), run.seq_len, at::TensorOptions(), modules);
  llama3::Llama3& model = *m.model;
  if (run.float8) float8::convert_to_float8(model, {.filter_fqns = {"output"}});
  plan.context_parallel.load_balance = run.load_balance;
  plan.context_parallel.rotate = run.rotate;
  if (mesh.size("tp") > 1) {
    plan.tensor_parallel =
        parallel::tensor_parallel_plan(spec, mesh.size("tp"), run.sequence_parallel, run.loss_parallel);
    plan.tensor_parallel.async = run.async_tp;
    plan.tensor_parallel.trace = run.trace;
  }
  plan.data_parallel.options = {.reshard_after_forward = run.reshard,
                                .param_dtype = run.bf16 ? at::kBFloat16 : at::kFloat,
                                .collectives = run.collectives,
                                .trace = run.trace};
  if (run.float8_all_gather) plan.data_parallel.options.float8_all_gather = float8::fsdp_float8_weights(model);
  plan.data_parallel.options.float8_precompute_scales = run.float8_precompute;
  m.applied = parallelize(model, mesh, plan);
  model.init_weights();  // after sharding: every rank fills only its shard
  m.params = model.unique_parameters();
  for (const auto& p : m.params) {
    for (const auto& item : model.named_parameters(/*recurse=*/true)) {
      if (item.value().is_same(p)) m.names.push_back(item.key());
    }
  }
  return m;
}

/// The model and optimizer state of a parity run, as the checkpoint saves and loads it.
inline checkpoint::State parity_state(const ParityModel& m, const Optimizer& optimizer, const dist::Mesh& mesh) {
  checkpoint::State state;
  checkpoint::add_model(state, m.names, m.params, &mesh);
  checkpoint::add_optimizer(state, m.names, optimizer, &mesh);
  return state;
}

inline ParityResult train_parity(const dist::Mesh& mesh, const ParityRun& run) {
  ParityModel m = parity_model(mesh, run);
  llama3::Llama3& model = *m.model;
  const parallel::ParallelPlan& plan = m.plan;
  ParityResult result;
  result.applied = std::move(m.applied);
  const Parallelized& applied = result.applied;
  // Plain cross-entropy unless the logits are vocab-sharded.
  const LossFn loss = [&applied](const at::Tensor& logits, const at::Tensor& labels) {
    return applied.cross_entropy_sum(logits, labels);
  };
  const auto& params = m.params;
  const std::unique_ptr<Optimizer> optimizer =
      build_optimizer(params, {.name = run.optimizer, .lr = kParityLr, .weight_decay = 0.1, .muon_lr = kParityLr},
                      m.names, {.mesh = &mesh, .adamw_modules = m.embedding_and_head});
  if (!run.load.empty()) {
    checkpoint::State state = parity_state(m, *optimizer, mesh);
    checkpoint::load(run.load, state);
  }
  const int64_t dp = mesh.size("dp");
  const int64_t dp_rank = mesh.coordinate("dp");
  const int64_t local = run.global_batch / dp;
  const auto [documents, positions] = run.documents ? global_documents(run) : std::pair<at::Tensor, at::Tensor>();
  for (int64_t step = run.first_step; step < run.steps; ++step) {
    optimizer->zero_grad();
    auto [input, labels] = global_batch(step, run, parity_args().vocab_size);
    std::vector<Microbatch> micro;
    const int64_t per_micro = local / run.accumulation;
    for (int64_t m = 0; m < run.accumulation; ++m) {
      const int64_t row = dp_rank * local + m * per_micro;
      const auto rows = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, row, per_micro) : t; };
      // Under CP this rank keeps its part of each sequence.
      parallel::LocalBatch part = applied.local_batch({.tokens = rows(input),
                                                       .labels = rows(labels),
                                                       .positions = rows(positions),
                                                       .document_ids = rows(documents)});
      micro.push_back({part.tokens, part.labels, part.attention});
    }
    double step_loss = 0;
    if (applied.pipeline()) {
      const auto stage = [&](int64_t s, const at::Tensor& x, const nn::AttentionContext& context) {
        return model.forward_part(x, plan.pipeline.stages[s], context);
      };
      for (const auto& mb : micro) {
        step_loss +=
            applied.pipeline()->step(stage, mb.input, mb.labels, loss, 1.0 / count_valid_tokens(labels), mb.attention);
      }
    } else {
      step_loss =
          forward_backward([&](const at::Tensor& t, const nn::AttentionContext& c) { return model.forward(t, c); },
                           micro, at::kCPU, count_valid_tokens(labels), run.bf16 && mesh.size("dp") == 1, loss)
              .loss;
    }
    at::Tensor loss = at::full({1}, step_loss, at::kDouble);
    mesh.group("dp_cp").all_reduce(loss).wait();  // each dp rank's rows, each cp rank's part of them
    result.losses.push_back(loss.item<double>());
    result.grad_norms.push_back(clip_grad_norm_(params, 1.0, &mesh));
    optimizer->step(kParityLr);
  }
  if (!run.save.empty()) checkpoint::save(run.save, parity_state(m, *optimizer, mesh), mesh, run.steps);
  for (const auto& p : params) {
    result.local_state_bytes += p.nbytes() + (p.grad().defined() ? p.grad().nbytes() : 0);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    for (const ParamState& s : optimizer->state(i)) result.local_state_bytes += s.like_param ? s.tensor.nbytes() : 0;
  }
  for (const auto& p : params) result.weights.push_back(whole(p, mesh));
  result.names = m.names;
  return result;
}

}  // namespace titan::test
