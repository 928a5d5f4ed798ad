// SPDX-License-Identifier: BSD-3-Clause
// Trainer<Model>: torchtitan's loop assembled from titan's parts. The template part only builds the
// model (counted on the meta device, then built on the device and initialised) and hands a type-erased handle to the
// compiled core.
//
// Example:
//   auto config = titan::parse_args(argc, argv);
//   titan::Trainer<titan::llama3::Llama3> trainer(config);
//   trainer.train();
#pragma once

#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/checkpoint/seed_checkpoint.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/models/trainable_model.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/train/detail/trainer_core.hpp"

namespace titan {

/// The FQN of each of params (a tied tensor: its first name).
template <class Model>
std::vector<std::string> parameter_names(const Model& model, const std::vector<at::Tensor>& params) {
  std::vector<std::string> names;
  const auto named = model.named_parameters(/*recurse=*/true);
  for (const auto& p : params) {
    for (const auto& item : named) {
      if (item.value().unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) {
        names.push_back(item.key());
        break;
      }
    }
  }
  return names;
}

template <TrainableModel Model>
class Trainer {
 public:
  explicit Trainer(JobConfig config) {
    // On the meta device first: counted (and later planned) before any memory is allocated.
    const auto planned = Model::build(config, 0, at::Device(at::kMeta));
    log::info("Model {} {}: {} parameters", config.model.name, config.model.flavor, planned->num_params());
    core_ = std::make_unique<detail::TrainerCore>(std::move(config), planned->vocab_size());
    core_->seed_for_init();
    // Under pipeline parallelism this rank builds only its stages' modules.
    const parallel::PipelinePlan pipeline = planned->parallel_plan(core_->config(), core_->mesh()).pipeline;
    model_ = Model::build(
        core_->config(), 0, core_->device(),
        pipeline.stages.empty() ? std::vector<std::string>{} : parallel::pipeline_modules(pipeline, core_->mesh()));
    // Converters (float8) swap layers' math before anything is sharded, as torchtitan converts first.
    core_->convert(*model_);
    // Shard first (the model's plan: PP split, TP, then FSDP on the TP shards), then initialise:
    // each rank fills only its shard (layout-invariant init).
    core_->parallelize(*model_, model_->parallel_plan(core_->config(), core_->mesh()));
    model_->init_weights();
    auto* raw = model_.get();
    std::vector<at::Tensor> params = model_->unique_parameters();
    core_->attach_model({
        .description = fmt::format("{} {}", core_->config().model.name, core_->config().model.flavor),
        .forward = [raw](const at::Tensor& tokens,
                         const nn::AttentionContext& context) { return raw->forward(tokens, context); },
        .stage_forward =
            [raw, stages = pipeline.stages](int64_t stage, const at::Tensor& x, const nn::AttentionContext& context) {
              return raw->forward_part(x, stages[static_cast<size_t>(stage)], context);
            },
        .parameters = params,
        .parameter_names = parameter_names(*model_, params),
        .hf_adapter = model_->hf_adapter(),
        // Counted on the unsharded (meta) model: sharded parameters hold only this rank's rows.
        .num_params = planned->num_params(),
        .flops_per_token = planned->num_flops_per_token(core_->config().training.seq_len),
    });
  }

  /// Trains to training.steps; with checkpoint.create_seed_checkpoint, writes the initial weights
  /// to <dump_folder>/<checkpoint.folder>/seed.safetensors instead and returns.
  void train() {
    const JobConfig& c = core_->config();
    if (c.checkpoint.create_seed_checkpoint) {
      const auto path = std::filesystem::path(c.job.dump_folder) / c.checkpoint.folder / "seed.safetensors";
      checkpoint::save_seed_checkpoint(*model_, core_->mesh(), path);
      log::info("Seed checkpoint written to {}; start runs from it with --checkpoint.initial_load_path {}",
                path.string(), path.string());
      return;
    }
    core_->train();
  }
  void train_step() { core_->train_step(); }

  Model& model() { return *model_; }
  detail::TrainerCore& core() { return *core_; }

 private:
  std::shared_ptr<Model> model_;
  std::unique_ptr<detail::TrainerCore> core_;
};

}  // namespace titan
