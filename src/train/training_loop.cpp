// SPDX-License-Identifier: BSD-3-Clause
// Trainer<Model>'s loop: the run's training components, called in torchtitan's order. Each piece is public
// (include/titan/train/); examples/custom_loop.cpp makes the same calls.
#include "titan/train/detail/training_loop.hpp"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "titan/checkpoint/safetensors.hpp"
#include "titan/checkpoint/seed_checkpoint.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/data/tokenizer.hpp"
#include "titan/dist/flight_recorder.hpp"
#include "titan/dist/heartbeat.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/layers.hpp"
#include "titan/optim/lr_schedule.hpp"
#include "titan/optim/muon.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/quant/qlora.hpp"
#include "titan/train/checkpointing.hpp"
#include "titan/train/data_setup.hpp"
#include "titan/train/evaluation.hpp"
#include "titan/train/moe_balancing.hpp"
#include "titan/train/mtp_loss.hpp"
#include "titan/train/preemption.hpp"
#include "titan/train/profiling.hpp"
#include "titan/train/replica_fault_tolerance.hpp"
#include "titan/train/run_context.hpp"
#include "titan/train/semi_sync.hpp"
#include "titan/train/training_metrics.hpp"
#include "titan/train/validation.hpp"

#include "preemption_signals.hpp"

namespace titan::detail {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

TrainingLoop::TrainingLoop(const RunContext& run, TrainedModel model) : run_(run), model_(std::move(model)) {
  const JobConfig& c = run.config();
  tokenizer_ = build_tokenizer(run, model_.vocab_size);
  loader_ = build_dataloader(c, tokenizer_, run.dp_rank(), run.dp_degree());
  optimizer_ = build_optimizer(model_.parameters, c.optimizer, model_.names,
                               {.mesh = &run.mesh(), .adamw_modules = model_.adamw_modules});
  schedule_ = std::make_unique<LRSchedule>(c.lr_scheduler, c.training.steps);
  moe_ = std::make_unique<MoeBalancing>(run, *model_.module, *model_.parallel);
  mtp_ = std::make_unique<MtpLoss>(run, *model_.module);
  if (c.fault_tolerance.enable && c.fault_tolerance.semi_sync_method)
    semi_sync_ = std::make_unique<SemiSync>(semi_sync_options(c.fault_tolerance), model_.parameters);
  const bool lora = !model_.frozen.empty();
  state_ = std::make_unique<TrainingState>(TrainingState::Parts{.parameters = model_.parameters,
                                                                .names = model_.names,
                                                                .frozen = model_.frozen,
                                                                .frozen_names = model_.frozen_names,
                                                                .lora = lora ? &c.lora : nullptr,
                                                                .optimizer = optimizer_.get(),
                                                                .loader = loader_.get(),
                                                                .expert_biases = moe_->expert_biases(),
                                                                .semi_sync = semi_sync_.get(),
                                                                .copies = mtp_->norm_copies(),
                                                                .mesh = &run.mesh(),
                                                                .run_state = run.run_state()});
  profiling_ = std::make_unique<Profiling>(run, model_.parameters);
  metrics_.emplace(training_metrics(run, model_.counts, [this] { return memory_parts(); }));
  if (c.validation.enable) validation_ = std::make_unique<Validation>(run, tokenizer_);
  if (c.eval.interval > 0) evaluation_ = std::make_unique<Evaluation>(run, tokenizer_);
  preemption_ = std::make_unique<Preemption>(run);
  faults_ = testing::faults();
  if (restart_count() != 0) {  // a restarted run must get past the step that killed or hung its first attempt
    faults_.kill.reset();
    faults_.hang.reset();
  }
  log_setup();
  checkpoints_ = std::make_unique<Checkpointing>(run, model_.hf_adapter);
  checkpoints_->load(*state_);
  if (c.lora.quantize_base) quantize_base();
  if (semi_sync_) semi_sync_->start();
  if (c.fault_tolerance.enable) replicas_ = std::make_unique<ReplicaFaultTolerance>(run, *state_);
}

TrainingLoop::~TrainingLoop() = default;

void TrainingLoop::log_setup() const {
  const JobConfig& c = run_.config();
  const MemoryStats mem = memory_stats(run_.device());
  log::info("{} {}: {} parameters, {:.4g} training FLOPs/token at seq_len {}", c.model.name, c.model.flavor,
            model_.counts.num_params, static_cast<double>(model_.counts.flops_per_token), c.training.seq_len);
  log::info("Memory after model init: {:.2f} GiB", static_cast<double>(mem.max_active) / kGiB);
  const int64_t trained_bytes = storage_bytes(model_.parameters);
  const int64_t param_bytes = trained_bytes + storage_bytes(model_.frozen);
  const int64_t optimizer_bytes = optimizer_->state_bytes();
  log::info(
      "Memory per rank: parameters {:.3f} GiB, gradients {:.3f} GiB once computed, optimizer state {:.3f} GiB; "
      "activations and communication buffers measured from step 1 (titan-plan predicts them)",
      static_cast<double>(param_bytes) / kGiB, static_cast<double>(trained_bytes) / kGiB,
      static_cast<double>(optimizer_bytes) / kGiB);
  // num_params counts the model as built, before a converter added adapters.
  const int64_t trainable = model_.counts.trainable_params;
  const int64_t total = model_.counts.num_params + (model_.frozen.empty() ? 0 : trainable);
  log::info("Trainable parameters: {} of {} ({:.3g}%){}; optimizer state {} bytes on this rank", trainable, total,
            100.0 * static_cast<double>(trainable) / static_cast<double>(std::max<int64_t>(1, total)),
            model_.frozen.empty() ? "" : ", LoRA adapters beside frozen base weights", optimizer_bytes);
  log::info(
      "Trainer is initialized with local batch size {}, global batch size {}, gradient accumulation steps {}, "
      "sequence length {}, total steps {} (warmup {})",
      c.training.local_batch_size, c.training.local_batch_size * run_.grad_accum_steps() * run_.dp_degree(),
      run_.grad_accum_steps(), c.training.seq_len, c.training.steps, c.lr_scheduler.warmup_steps);
}

void TrainingLoop::quantize_base() {
  int64_t dense = 0;
  for (const auto& [path, linear] : quant::lora_base_linears(*model_.module)) dense += linear->weight.nbytes();
  const std::vector<quant::QloraBase> bases = quant::quantize_lora_base(*model_.module);
  for (const quant::QloraBase& b : bases) {
    nf4_bases_.insert(nf4_bases_.end(),
                      {b.weight->codes, b.weight->scalers, b.weight->scaler_factors, b.weight->scaler_mean});
  }
  const int64_t held = storage_bytes(model_.parameters) + storage_bytes(model_.frozen) + storage_bytes(nf4_bases_);
  log::info("qlora: {} base weights in NF4, {} bytes instead of {}; parameters {} bytes ({:.3f} GiB) on this rank",
            bases.size(), storage_bytes(nf4_bases_), dense, held, static_cast<double>(held) / kGiB);
}

void TrainingLoop::train() {
  const JobConfig& c = run_.config();
  if (c.checkpoint.create_seed_checkpoint) {
    const auto path = run_.run_folder() / c.checkpoint.folder / "seed.safetensors";
    checkpoint::save_seed_checkpoint(*model_.module, run_.mesh(), path);
    log::info("Seed checkpoint written to {}; start runs from it with --checkpoint.initial_load_path {}", path.string(),
              path.string());
    return;
  }
  log::info("Training starts at step {}", state_->step + 1);
  while (state_->step < c.training.steps && stop_signal_ == 0) train_step();
  dist::report_progress(state_->step, "training finished", /*timed=*/false);
  profiling_->finish(state_->step);
  checkpoints_->wait();
  // Every rank stops reading rank 0's store before rank 0 may exit.
  dist::detach_flight_recorder_store();
  run_.mesh().group("world").barrier();
  if (stop_signal_ != 0 && state_->step < c.training.steps) {
    log::info("Training stopped at step {} on {}; its checkpoint is saved, the same command resumes at step {}",
              state_->step, Preemption::signal_name(stop_signal_), state_->step + 1);
    return;
  }
  log::info("Training completed at step {}", state_->step);
}

void TrainingLoop::train_step() {
  profiling_->step(state_->step + 1, [this] { run_step(); });
}

void TrainingLoop::run_step() {
  const JobConfig& c = run_.config();
  const Parallelized& parallel = *model_.parallel;
  // Under semi-sync the groups meet only in the outer step, after every sync_steps inner steps.
  const bool every_step = replicas_ && !semi_sync_;
  if (every_step) replicas_->join(*state_);
  const int64_t step = state_->step + 1;
  // The heartbeat (every rank's progress, read through the store) times each phase of the step.
  dist::report_progress(step, "data loading");
  inject_step_faults(faults_, run_.mesh().rank(), step);
  optimizer_->zero_grad();
  const double lr = c.optimizer.lr * schedule_->factor(step - 1);
  // A step that does not commit across replica groups runs again on the same batch.
  const nlohmann::json loader_before = every_step ? loader_->state() : nlohmann::json();
  // Every microbatch first: the loss is normalised by the valid tokens of the whole global batch.
  const StepBatch batch = pull_microbatches(*loader_, parallel, run_.mesh(), run_.grad_accum_steps());
  mtp_->start_step(batch);
  const ForwardBackwardResult fb = forward_and_backward(step, batch);
  mtp_->sum_embedding_grads(parallel.pipeline());   // the last stage's copy of the embedding steps as the first's
  if (losses_.empty()) parallel.check_contracts();  // this process's first step used the plan as planned
  TITAN_CHECK(std::isfinite(fb.loss),
              "[titan::Trainer] expected a finite loss, got {} at step {}. Lower optimizer.lr, raise "
              "lr_scheduler.warmup_steps, or check the data; debug.deterministic reproduces the run.",
              fb.loss, step);
  if (every_step && !replicas_->commit(model_.parameters)) {
    log::warn("Step {} did not commit across the replica groups (one failed): running it again with the live ones",
              step);
    loader_->load_state(loader_before);
    return;
  }
  state_->step = step;
  const std::vector<at::Tensor> loads = moe_->balance();  // before the optimizer moves the weights
  dist::report_progress(step, "optimizer step");
  const double grad_norm = optimizer_step(*optimizer_, lr, c.training.max_norm, run_.mesh(), mtp_->norm_copies());
  if (semi_sync_ && semi_sync_->due(step)) {
    dist::report_progress(step, "outer step");
    replicas_->outer_step(*state_, *semi_sync_);
  }
  losses_.push_back(fb.loss);
  metrics_->add_step(fb.tokens, batch.load_seconds);
  if (is_log_step(c, step)) log_step(step, fb, grad_norm, lr, loads);
  if (parallel.pipeline() && step == std::min<int64_t>(2, c.training.steps)) write_pipeline_timeline(step);
  if (validation_ && validation_->due(step)) validate(step);
  if (evaluation_ && evaluation_->due(step)) evaluate(step);
  stop_signal_ = preemption_->stop_signal();
  // Not timed: a save's commit times the ranks' writes itself (comm.train_timeout_seconds).
  dist::report_progress(step, "checkpoint save", /*timed=*/false);
  checkpoints_->maybe_save(*state_, stop_signal_ != 0);
}

ForwardBackwardResult TrainingLoop::forward_and_backward(int64_t step, const StepBatch& batch) {
  const MemoryScope activations(MemoryCategory::activations);
  dist::report_progress(step, "forward/backward");
  ForwardBackwardResult fb = forward_backward(
      *model_.parallel, mtp_->labelled(model_.step_model, batch, run_.device(), model_.parallel->pipeline()), batch,
      run_.mesh(), run_.device(), model_.bf16_autocast);
  if (faults_.oom_step == step) {  // fails inside the activations' scope, as a real one would
    TORCH_CHECK_WITH(OutOfMemoryError, false, "test fault oom: simulated out of memory at step ", step);
  }
  return fb;
}

void TrainingLoop::log_step(int64_t step, const ForwardBackwardResult& fb, double grad_norm, double lr,
                            const std::vector<at::Tensor>& loads) {
  if (const double ratio = moe_->max_load_ratio(loads); ratio > 0) metrics_->add_scalar("moe/max_load_ratio", ratio);
  if (replicas_) metrics_->add_scalar("ft/live_replicas", static_cast<double>(replicas_->live()));
  // Apart from the next-token loss, which stays comparable to a run without multi-token prediction.
  if (const std::optional<double> mtp = mtp_->step_loss()) metrics_->add_scalar("loss_metrics/mtp_loss", *mtp);
  const StepMetrics logged = metrics_->log(step, fb.loss, grad_norm, lr);
  if (!logged.parts) return;
  last_memory_ = *logged.parts;
  if (step != 1) return;
  const MemoryParts& m = *logged.parts;
  log::info(
      "Memory per rank at step 1: parameters {:.3f} GiB, gradients {:.3f} GiB, optimizer {:.3f} GiB, "
      "activations {:.3f} GiB (peak), communication {:.3f} GiB (peak){}",
      static_cast<double>(m.parameters) / kGiB, static_cast<double>(m.gradients) / kGiB,
      static_cast<double>(m.optimizer) / kGiB, static_cast<double>(m.activations) / kGiB,
      static_cast<double>(m.communication) / kGiB, run_.device().is_cuda() ? " (CUDA: not split out)" : "");
}

void TrainingLoop::validate(int64_t step) {
  dist::report_progress(step, "validation");
  model_.module->eval();  // no dropout (LoRA's) in an evaluation forward
  const ValidationResult r = validation_->run(model_.step_model, *model_.parallel);
  model_.module->train();
  if (r.tokens > 0) metrics_->log_validation(step, r.loss(), r.tokens);
}

void TrainingLoop::evaluate(int64_t step) {
  dist::report_progress(step, "evaluation");
  model_.module->eval();  // no dropout (LoRA's) in an evaluation forward
  metrics_->log_record(step, "eval", Evaluation::scalars(evaluation_->run(model_.step_model, *model_.parallel)));
  model_.module->train();
}

MemoryParts TrainingLoop::memory_parts() {
  // Every parameter this rank holds: a LoRA run's frozen base too (it has no gradient).
  std::vector<at::Tensor> held = model_.parameters;
  held.insert(held.end(), model_.frozen.begin(), model_.frozen.end());
  held.insert(held.end(), nf4_bases_.begin(), nf4_bases_.end());
  return profiling_->memory_parts(held, *optimizer_);
}

void TrainingLoop::write_pipeline_timeline(int64_t step) const {
  const parallel::PipelineTimeline timeline = model_.parallel->pipeline()->gather_timeline();
  if (run_.mesh().rank() != 0) return;
  checkpoint::write_file_atomically(run_.run_folder() / "pipeline_timeline.json", parallel::timeline_json(timeline));
  checkpoint::write_file_atomically(run_.run_folder() / "pipeline_timeline.svg",
                                    parallel::render_timeline_svg(timeline, fmt::format("step {} measured", step)));
  log::info("Pipeline step {}: measured bubble {:.1f}%, timeline in {}", step,
            100.0 * parallel::bubble_fraction(timeline), (run_.run_folder() / "pipeline_timeline.svg").string());
}

}  // namespace titan::detail
