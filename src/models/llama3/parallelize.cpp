// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/llama3/parallelize.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/float8/converter.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/parallel/pipeline_schedule.hpp"

namespace titan::llama3 {

using parallel::ColwiseParallel;
using parallel::Placement;
using parallel::PrepareModuleInput;
using parallel::RowwiseParallel;
using parallel::SequenceParallel;

std::vector<std::vector<std::string>> data_parallel_units(const Llama3& model) {
  std::vector<std::vector<std::string>> units{{"tok_embeddings"}};
  for (int64_t i = 0; i < model.args().n_layers; ++i) units.push_back({"layers." + std::to_string(i)});
  // Norm and output run back to back and start backward: one unit, one collective.
  if (!model.args().tie_word_embeddings) {
    units.push_back({"norm", "output"});
  } else {
    units.push_back({"norm"});
  }
  return units;
}

parallel::TensorParallelPlan tensor_parallel_plan(const Llama3& model, int64_t degree,
                                                  const TensorParallelOptions& options) {
  const Llama3Args& args = model.args();
  TITAN_CHECK_VALUE(args.n_heads % degree == 0 && args.kv_heads() % degree == 0,
                    "[titan::llama3::tensor_parallel_plan] expected n_heads ({}) and n_kv_heads ({}) divisible by the "
                    "tensor-parallel degree {} (path layers.*.attention). Choose a degree that divides both.",
                    args.n_heads, args.kv_heads(), degree);
  TITAN_CHECK_NOT_IMPLEMENTED(!args.tie_word_embeddings,
                              "[titan::llama3::tensor_parallel_plan] expected an untied output "
                              "layer, got tie_word_embeddings = true. Tied embeddings under TP are not supported yet.");
  const bool sp = options.sequence_parallel;
  // Between blocks activations are sequence-sharded (SP) or replicated; inside attention and the
  // feed-forward they are replicated over the sequence and sharded over heads / hidden features.
  const Placement between = sp ? Placement::shard(1) : Placement::replicate();
  parallel::TensorParallelPlan plan;
  plan.add("tok_embeddings", RowwiseParallel{.input_layout = Placement::replicate(), .output_layout = between});
  for (int64_t i = 0; i < args.n_layers; ++i) {
    const std::string block = "layers." + std::to_string(i);
    if (sp) plan.add(block + ".attention_norm", SequenceParallel{});
    plan.add(block + ".attention",
             PrepareModuleInput{.input_layout = between, .desired_input_layout = Placement::replicate()});
    for (const char* w : {".attention.wq", ".attention.wk", ".attention.wv"}) plan.add(block + w, ColwiseParallel{});
    plan.add(block + ".attention.wo", RowwiseParallel{.output_layout = between});
    if (sp) plan.add(block + ".ffn_norm", SequenceParallel{});
    plan.add(block + ".feed_forward",
             PrepareModuleInput{.input_layout = between, .desired_input_layout = Placement::replicate()});
    for (const char* w : {".feed_forward.w1", ".feed_forward.w3"}) plan.add(block + w, ColwiseParallel{});
    plan.add(block + ".feed_forward.w2", RowwiseParallel{.output_layout = between});
  }
  if (sp) plan.add("norm", SequenceParallel{});
  plan.add("output",
           ColwiseParallel{.input_layout = between,
                           .output_layout = options.loss_parallel ? Placement::shard(-1) : Placement::replicate(),
                           .loss_parallel = options.loss_parallel});
  return plan;
}

parallel::PipelinePlan pipeline_plan(const Llama3Args& args, int64_t pp, const ParallelismConfig& p) {
  parallel::PipelinePlan plan{.schedule = p.pipeline_parallel_schedule,
                              .schedule_csv = p.pipeline_parallel_schedule_csv,
                              .microbatch_size = p.pipeline_parallel_microbatch_size};
  if (p.module_fqns_per_model_part) {
    plan.stages = *p.module_fqns_per_model_part;
    return plan;
  }
  // A CSV program runs several stages per rank, as torchtitan's CSV runtime does.
  const PipelineSchedule shape =
      p.pipeline_parallel_schedule_csv.empty() ? p.pipeline_parallel_schedule : PipelineSchedule::interleaved_1f1b;
  const int64_t stages = parallel::num_pipeline_stages(
      shape, pp, args.n_layers, p.pipeline_parallel_layers_per_stage.value_or(0),
      p.pipeline_parallel_first_stage_less_layers, p.pipeline_parallel_last_stage_less_layers);
  parallel::PipelineSplit split{.input_modules = {"tok_embeddings"},
                                .output_modules = {"norm", "output"},
                                .first_stage_less_layers = p.pipeline_parallel_first_stage_less_layers,
                                .last_stage_less_layers = p.pipeline_parallel_last_stage_less_layers};
  for (int64_t i = 0; i < args.n_layers; ++i) split.layer_modules.push_back("layers." + std::to_string(i));
  plan.stages = parallel::split_pipeline_stages(split, stages);
  return plan;
}

parallel::ContextParallelPlan context_parallel_plan(const Llama3Args& args, const ParallelismConfig& p) {
  parallel::ContextParallelPlan plan{.load_balance = p.context_parallel_load_balancer.has_value(),
                                     .rotate = p.context_parallel_rotate_method};
  for (int64_t i = 0; i < args.n_layers; ++i) plan.attention_modules.push_back(fmt::format("layers.{}.attention", i));
  return plan;
}

parallel::ActivationCheckpointPlan activation_checkpoint_plan(const Llama3Args& args,
                                                              const ActivationCheckpointConfig& ac) {
  parallel::ActivationCheckpointPlan plan{.preserve_rng_state = ac.preserve_rng_state};
  if (ac.mode == AcMode::none) return plan;
  if (ac.mode == AcMode::memory_budget) {
    throw ConfigError("activation_checkpoint.mode",
                      "[titan::llama3] expected activation_checkpoint.mode none, full or selective, got memory_budget "
                      "(torchtitan's compiler-driven policy; titan has no graph compiler). Use full or selective.");
  }
  int64_t every = 1;  // full: every block
  if (ac.mode == AcMode::selective) {
    std::string option = ac.selective_ac_option;
    if (option == "op") {
      option = "1";
      plan.per_op = true;
      // torchtitan's default targets MoE routers; a dense Llama has none, so only other entries are checked.
      for (const std::string& fqn : ac.per_op_sac_force_recompute_mm_shapes_by_fqns) {
        if (fqn != "moe.router.gate") plan.force_recompute_mm.push_back(fqn);
      }
    }
    const bool digits = !option.empty() && option.size() < 10 &&
                        std::all_of(option.begin(), option.end(), [](char c) { return c >= '0' && c <= '9'; });
    every = digits ? std::stoll(option) : 0;
    if (every < 1) {
      throw ConfigError("activation_checkpoint.selective_ac_option",
                        fmt::format("[titan::llama3] expected activation_checkpoint.selective_ac_option to be an "
                                    "integer N >= 1 (checkpoint every N-th block) or op, got '{}'.",
                                    ac.selective_ac_option));
    }
  }
  // torchtitan counts blocks from 1 and wraps the N-th, 2N-th, ...
  for (int64_t i = 0; i < args.n_layers; ++i) {
    if ((i + 1) % every == 0) plan.modules.push_back(fmt::format("layers.{}", i));
  }
  return plan;
}

parallel::ParallelPlan parallel_plan(const Llama3& model, const dist::Mesh& mesh) {
  parallel::ParallelPlan plan{.data_parallel = {.units = data_parallel_units(model)}};
  if (mesh.size("cp") > 1) plan.context_parallel = context_parallel_plan(model.args(), ParallelismConfig{});
  if (mesh.size("pp") > 1) plan.pipeline = pipeline_plan(model.args(), mesh.size("pp"), ParallelismConfig{});
  if (mesh.size("tp") > 1) plan.tensor_parallel = tensor_parallel_plan(model, mesh.size("tp"));
  return plan;
}

parallel::ParallelPlan parallel_plan(const Llama3& model, const JobConfig& config, const dist::Mesh& mesh) {
  const ParallelismConfig& p = config.parallelism;
  parallel::ParallelPlan plan{.data_parallel = {.units = data_parallel_units(model)}};
  if (mesh.size("tp") > 1) {
    plan.tensor_parallel = tensor_parallel_plan(model, mesh.size("tp"), {.loss_parallel = !p.disable_loss_parallel});
    plan.tensor_parallel.async = p.enable_async_tensor_parallel;
  }
  if (mesh.size("pp") > 1) plan.pipeline = pipeline_plan(model.args(), mesh.size("pp"), p);
  if (mesh.size("cp") > 1) plan.context_parallel = context_parallel_plan(model.args(), p);
  plan.activation_checkpoint = activation_checkpoint_plan(model.args(), config.activation_checkpoint);
  parallel::DataParallelOptions& dp = plan.data_parallel.options;
  dp.reshard_after_forward = p.fsdp_reshard_after_forward;
  // torchtitan's default under PP: keep units gathered after forward (no all-gather per microbatch).
  if (mesh.size("pp") > 1 && dp.reshard_after_forward == ReshardAfterForward::default_) {
    dp.reshard_after_forward = ReshardAfterForward::never;
  }
  // FSDP's mixed precision (bf16 gathers and compute, fp32 reduction): by default on GPU; on CPU when
  // training.mixed_precision_param says bfloat16. Without data parallelism the trainer autocasts instead.
  const bool cuda = !model.parameters().empty() && model.parameters().front().device().is_cuda();
  dp.param_dtype = scalar_type(mixed_precision_param(config.training, cuda));
  dp.reduce_dtype = scalar_type(config.training.mixed_precision_reduce);
  // torchao's float8 all-gather: the weights of the float8 Linears the converter made (run before this).
  if (config.float8.enable_fsdp_float8_all_gather) {
    dp.float8_all_gather = float8::fsdp_float8_weights(model);
    dp.float8_precompute_scales = config.float8.precompute_float8_dynamic_scale_for_fsdp;
  }
  return plan;
}

parallel::ParallelPlan Llama3::parallel_plan(const JobConfig& config, const dist::Mesh& mesh) const {
  return llama3::parallel_plan(*this, config, mesh);
}

}  // namespace titan::llama3
