// SPDX-License-Identifier: BSD-3-Clause
// Trainer<Model>: torchtitan's loop assembled from titan's public training components, in this order: the run
// (RunContext: config, mesh, device, seeds, run folder), the model as this rank trains it (RankModel: counted and
// planned once on meta, built, converted, parallelized, initialised), then data, optimizer and schedule, MoE
// balancing, the training state and its checkpoints, validation, preemption, replica fault tolerance, profiling
// and metrics. Each step is a short sequence of calls to them (src/train/training_loop.cpp, readable top to
// bottom); examples/custom_loop.cpp makes the same calls in a loop of its own and gets the same bits.
//
// Example:
//   auto config = titan::parse_args(argc, argv);
//   titan::Trainer<titan::models::Decoder> trainer(config);   // model.name's family
//   trainer.train();
#pragma once

#include <memory>
#include <utility>

#include "titan/core/config.hpp"
#include "titan/models/job_args.hpp"
#include "titan/models/trainable_model.hpp"
#include "titan/train/detail/training_loop.hpp"
#include "titan/train/rank_model.hpp"
#include "titan/train/run_context.hpp"

namespace titan {

/// Whether the job config names Model's arguments (models::JobArgs<Model>): Trainer<Model>(config) then builds it.
template <class Model>
concept ModelFromJob = requires(const JobConfig& config) {
  { models::JobArgs<Model>::make(config) } -> std::convertible_to<typename Model::Args>;
};

template <TrainableModel Model>
class Trainer {
 public:
  /// The job's model (models::JobArgs: model.name, model.flavor, training.seq_len) trained as the job says.
  explicit Trainer(JobConfig config) requires ModelFromJob<Model>
      : Trainer(config, models::JobArgs<Model>::make(config)) {}

  /// A model of `args` trained as the job says.
  Trainer(JobConfig config, const typename Model::Args& args)
      : run_(std::make_unique<RunContext>(std::move(config))),
        model_(std::make_unique<RankModel<Model>>(*run_, args)),
        loop_(std::make_unique<detail::TrainingLoop>(*run_, detail::TrainedModel{
                                                                .module = &model_->model(),
                                                                .parallel = &model_->parallel(),
                                                                .step_model = model_->step_model(),
                                                                .parameters = model_->parameters(),
                                                                .names = model_->parameter_names(),
                                                                .adamw_modules = model_->embedding_and_head_modules(),
                                                                .frozen = model_->frozen_parameters(),
                                                                .frozen_names = model_->frozen_parameter_names(),
                                                                .hf_adapter = model_->model().hf_adapter(),
                                                                .counts = model_->counts(),
                                                                .vocab_size = model_->model().vocab_size(),
                                                                .bf16_autocast = model_->bf16_autocast(),
                                                            })) {}

  /// Trains to training.steps; with checkpoint.create_seed_checkpoint, writes the initial weights to
  /// <dump_folder>/<checkpoint.folder>/seed.safetensors instead and returns.
  void train() { loop_->train(); }
  /// One step (all its gradient-accumulation microbatches).
  void train_step() { loop_->train_step(); }

  Model& model() { return model_->model(); }
  const RankModel<Model>& rank_model() const { return *model_; }
  const RunContext& run() const { return *run_; }
  /// The loop's state: losses so far, the optimizer, the step.
  detail::TrainingLoop& core() { return *loop_; }

 private:
  std::unique_ptr<RunContext> run_;
  std::unique_ptr<RankModel<Model>> model_;
  std::unique_ptr<detail::TrainingLoop> loop_;
};

}  // namespace titan
