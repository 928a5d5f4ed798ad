// SPDX-License-Identifier: BSD-3-Clause
// RankModel<Model>: a model as one rank of a job trains it. Built once on the meta device, where it is counted and
// planned (its ShardingSpec and the job's settings through parallel::plan, once); then built on the rank's device
// (under pipeline parallelism only its stages), converted (model.converters: float8, lora), made parallel by the plan
// and initialised shard by shard, so every layout starts from the same weights; its parameters in the training
// dtype. The Trainer holds one; so does a loop of your own:
//
//   titan::RunContext run(titan::parse_args(argc, argv));
//   titan::RankModel<titan::models::Decoder> model(run, titan::models::decoder_args(run.config()));
//   auto optimizer = titan::build_optimizer(model.parameters(), run.config().optimizer, model.parameter_names(),
//       {.mesh = &run.mesh(), .adamw_modules = model.embedding_and_head_modules()});
#pragma once

#include <fmt/format.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/log.hpp"
#include "titan/models/trainable_model.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/plan.hpp"
#include "titan/train/run_context.hpp"
#include "titan/train/step.hpp"

namespace titan {

/// A model's size as MFU counts it: the whole model, whatever part of it a rank holds.
struct ModelCounts {
  /// Parameters (every expert, tied weights once).
  int64_t num_params = 0;
  /// Training FLOPs per token at training.seq_len.
  int64_t flops_per_token = 0;
  /// Parameters the optimizer trains: num_params, or a LoRA run's adapters (whole model, like num_params).
  int64_t trainable_params = 0;
};

/// The parameter names (FQNs) of `params` in `model` (a tied tensor: its first name; a pipeline's last stage's copy of
/// the embedding, for multi-token prediction: tok_embeddings.weight, the weight it copies).
std::vector<std::string> parameter_names(const torch::nn::Module& model, const std::vector<at::Tensor>& params);

namespace detail {
/// What model.converters did to a model.
struct ModelConversion {
  /// Linears float8 converted (module paths).
  std::vector<std::string> float8{};
  /// Whether lora ran: the adapters train, every other parameter is frozen.
  bool lora = false;
  /// Elements of the adapters (whole tensors; 0 without lora).
  int64_t adapter_params = 0;
};
/// model.converters applied to `model` in their order (float8: float8::convert_to_float8 with [float8]'s options;
/// lora: nn::add_lora with [lora]'s). `log_report` logs what the conversion did (the meta model converts quietly);
/// `part`: model is a pipeline rank's stages, whose Linears a lora.target_modules entry may all miss.
ModelConversion convert_model(const RunContext& run, torch::nn::Module& model, bool log_report, bool part = false);
/// parallel::plan of `spec` with the job's options (parallel::plan_options of the converted meta model) on the
/// run's mesh.
parallel::ParallelPlan plan_for_run(const RunContext& run, const parallel::ShardingSpec& spec,
                                    const torch::nn::Module& converted);
/// Applies `plan` over the run's mesh and logs what it applied.
Parallelized parallelize_for_run(const RunContext& run, torch::nn::Module& model, const parallel::ParallelPlan& plan);
/// Casts `params` and `frozen` to training.dtype and makes `params` require gradients.
void prepare_parameters(const RunContext& run, const std::vector<at::Tensor>& params,
                        const std::vector<at::Tensor>& frozen = {});
/// Initialises what the converters added (LoRA's adapters), after the model's init_weights.
void init_converted(const ModelConversion& conversion, torch::nn::Module& model);
/// The stages of `plan` this rank builds (empty without a pipeline: the whole model).
std::vector<std::string> rank_modules(const RunContext& run, const parallel::ParallelPlan& plan);
/// The module paths of spec's embeddings and output head (the vocab_embedding, position_embedding and head roles).
std::vector<std::string> embedding_and_head_modules(const parallel::ShardingSpec& spec);
/// Whether forwards run under bf16 autocast: fp32 parameters that no data parallelism casts, with
/// training.mixed_precision_param bfloat16 (torchtitan's single-device mixed precision; on CPU only when asked).
bool bf16_autocast(const RunContext& run, const Parallelized& parallel);

}  // namespace detail

template <TrainableModel Model>
class RankModel {
 public:
  RankModel(const RunContext& run, const typename Model::Args& args) {
    // On the meta device first: counted and planned before any memory is allocated.
    const std::shared_ptr<Model> whole = Model::build(args, {.device = at::kMeta});
    counts_ = {.num_params = whole->num_params(),
               .flops_per_token = whole->num_flops_per_token(run.config().training.seq_len)};
    log::info("Model {} {}: {} parameters", run.config().model.name, run.config().model.flavor, counts_.num_params);
    run.seed_for_init();
    // The meta model converts as the real one will, so the plan knows the float8 weights FSDP gathers and the
    // counts the whole model's adapters.
    const detail::ModelConversion whole_conversion = detail::convert_model(run, *whole, /*log_report=*/false);
    counts_.trainable_params = whole_conversion.lora ? whole_conversion.adapter_params : counts_.num_params;
    const parallel::ShardingSpec spec = whole->sharding_spec();
    plan_ = detail::plan_for_run(run, spec, *whole);
    embedding_and_head_ = detail::embedding_and_head_modules(spec);
    model_ = Model::build(args, {.device = run.device(), .modules = detail::rank_modules(run, plan_)});
    // Converters swap layers' math before anything is sharded, as torchtitan converts first.
    const detail::ModelConversion conversion =
        detail::convert_model(run, *model_, /*log_report=*/true, /*part=*/!plan_.pipeline.stages.empty());
    float8_converted_ = conversion.float8;
    // Shard first (the PP split, TP, then FSDP on the TP shards), then initialise: each rank fills only its shard.
    parallel_ = std::make_unique<Parallelized>(detail::parallelize_for_run(run, *model_, plan_));
    model_->init_weights();
    detail::init_converted(conversion, *model_);
    for (const at::Tensor& p : model_->unique_parameters()) {
      (!conversion.lora || p.requires_grad() ? parameters_ : frozen_).push_back(p);
    }
    names_ = titan::parameter_names(*model_, parameters_);
    frozen_names_ = titan::parameter_names(*model_, frozen_);
    detail::prepare_parameters(run, parameters_, frozen_);
    autocast_ = detail::bf16_autocast(run, *parallel_);
  }

  Model& model() const { return *model_; }
  Model* operator->() const { return model_.get(); }
  /// The plan, computed once.
  const parallel::ParallelPlan& plan() const { return plan_; }
  /// The parallel state the plan left (the loss, the pipeline, the local batch).
  const Parallelized& parallel() const { return *parallel_; }
  const ModelCounts& counts() const { return counts_; }
  /// Trainable tensors, each once, and their FQNs (the checkpoint's keys).
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  const std::vector<std::string>& parameter_names() const { return names_; }
  /// The module paths of the model's embeddings and output head (its spec's roles): Muon leaves them to AdamW.
  const std::vector<std::string>& embedding_and_head_modules() const { return embedding_and_head_; }
  /// Tensors a converter froze (a LoRA run's base weights), each once, and their FQNs; empty without.
  const std::vector<at::Tensor>& frozen_parameters() const { return frozen_; }
  const std::vector<std::string>& frozen_parameter_names() const { return frozen_names_; }
  /// Whether the step runs the forwards under bf16 autocast (forward_backward's bf16_autocast).
  bool bf16_autocast() const { return autocast_; }
  /// The module paths the float8 converter converted (empty without it).
  const std::vector<std::string>& float8_converted() const { return float8_converted_; }
  /// The forwards the step parts run: the whole model, or under PP stage s of the plan.
  StepModel step_model() const {
    Model* raw = model_.get();
    return {.forward = [raw](const at::Tensor& tokens,
                             const nn::AttentionContext& context) { return raw->forward(tokens, context); },
            .stage_forward =
                [raw, stages = plan_.pipeline.stages](int64_t stage, const at::Tensor& x,
                                                      const nn::AttentionContext& context) {
                  return raw->forward_part(x, stages[static_cast<size_t>(stage)], context);
                }};
  }

 private:
  std::shared_ptr<Model> model_;
  parallel::ParallelPlan plan_;
  std::unique_ptr<Parallelized> parallel_;
  ModelCounts counts_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  std::vector<std::string> embedding_and_head_;
  std::vector<at::Tensor> frozen_;
  std::vector<std::string> frozen_names_;
  std::vector<std::string> float8_converted_;
  bool autocast_ = false;
};

}  // namespace titan
