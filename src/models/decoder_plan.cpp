// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/decoder_plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <unordered_set>

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/float8/converter.hpp"
#include "titan/models/decoder.hpp"
#include "titan/parallel/pipeline_schedule.hpp"

namespace titan::models {

void unknown_flavor(const std::vector<std::string>& known, std::string_view name, const char* where) {
  throw ConfigError("model.flavor", fmt::format("[{}] expected model.flavor to be one of {}, got '{}'. Pick one of "
                                                "these flavors.",
                                                where, known, name));
}

ModelParts::ModelParts(const std::vector<std::string>& modules, int64_t n_layers, bool tied, const char* where)
    : modules_(modules) {
  for (const auto& path : modules) {
    const bool known = path == "tok_embeddings" || path == "norm" || path == "output" ||
                       (layer_index(path) >= 0 && layer_index(path) < n_layers);
    TITAN_CHECK_VALUE(known && !(path == "output" && tied),
                      "[{}] expected model parts named tok_embeddings, layers.0 .. layers.{}, norm{}, got '{}'. Fix "
                      "the pipeline split (module_fqns_per_model_part).",
                      where, n_layers - 1, tied ? "" : ", output", path);
  }
  TITAN_CHECK_NOT_IMPLEMENTED(modules.empty() || !tied,
                              "[{}] expected untied embeddings in a model part, got tie_word_embeddings = true: the "
                              "first and last stage would share a weight. Pipeline parallelism needs a flavor with "
                              "its own output layer.",
                              where);
}

bool ModelParts::holds(const std::string& path) const {
  return modules_.empty() || std::find(modules_.begin(), modules_.end(), path) != modules_.end();
}

int64_t ModelParts::layer_index(const std::string& path) {
  if (!path.starts_with("layers.")) return -1;
  const std::string digits = path.substr(std::string("layers.").size());
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::vector<at::Tensor> unique_parameters(const torch::nn::Module& model) {
  std::vector<at::Tensor> unique;
  std::unordered_set<const void*> seen;
  for (const auto& p : model.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) unique.push_back(p);
  }
  return unique;
}

ParameterGroups parameter_groups(const torch::nn::Module& model) {
  ParameterGroups g;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const int64_t n = item.value().numel();
    if (name.find("embedding") != std::string::npos) {
      g.embedding += n;
    } else if (name.find("moe.shared_experts") != std::string::npos) {
      g.shared_experts += n;
    } else if (name.find("moe.router") != std::string::npos) {
      g.router += n;
    } else if (name.find("moe.experts") != std::string::npos) {
      g.routed_experts += n;
    } else {
      g.dense += n;
    }
  }
  return g;
}

std::vector<std::vector<std::string>> data_parallel_units(const DecoderShape& shape) {
  std::vector<std::vector<std::string>> units{{"tok_embeddings"}};
  for (int64_t i = 0; i < shape.n_layers; ++i) {
    const std::string block = "layers." + std::to_string(i);
    if (std::find(shape.moe_layers.begin(), shape.moe_layers.end(), i) == shape.moe_layers.end()) {
      units.push_back({block});
      continue;
    }
    // The routed experts hold most of an MoE block's weights: a unit of their own, gathered after
    // the attention has run.
    std::vector<std::string> dense{block + ".attention_norm", block + ".attention", block + ".ffn_norm",
                                   block + ".moe.router"};
    if (shape.shared_experts) dense.push_back(block + ".moe.shared_experts");
    units.push_back(std::move(dense));
    units.push_back({block + ".moe.experts"});
  }
  // Norm and output run back to back and start backward: one unit, one collective.
  if (!shape.tied) {
    units.push_back({"norm", "output"});
  } else {
    units.push_back({"norm"});
  }
  return units;
}

parallel::TensorParallelPlan tensor_parallel_plan(const DecoderShape& shape, int64_t degree, bool sequence_parallel,
                                                  bool loss_parallel, bool sharded_experts) {
  using parallel::ColwiseParallel;
  using parallel::Placement;
  using parallel::PrepareModuleInput;
  using parallel::RowwiseParallel;
  using parallel::SequenceParallel;
  TITAN_CHECK_VALUE(shape.n_heads % degree == 0 && shape.n_kv_heads % degree == 0,
                    "[{}::tensor_parallel_plan] expected n_heads ({}) and n_kv_heads ({}) divisible by the "
                    "tensor-parallel degree {} (path layers.*.attention). Choose a degree that divides both.",
                    shape.where, shape.n_heads, shape.n_kv_heads, degree);
  TITAN_CHECK_NOT_IMPLEMENTED(!shape.tied,
                              "[{}::tensor_parallel_plan] expected an untied output layer, got tie_word_embeddings = "
                              "true. Tied embeddings under TP are not supported yet.",
                              shape.where);
  const bool sp = sequence_parallel;
  // Between blocks activations are sequence-sharded (SP) or replicated; inside attention and the
  // feed-forward they are replicated over the sequence and sharded over heads / hidden features.
  const Placement between = sp ? Placement::shard(1) : Placement::replicate();
  parallel::TensorParallelPlan plan;
  plan.add("tok_embeddings", RowwiseParallel{.input_layout = Placement::replicate(), .output_layout = between});
  for (int64_t i = 0; i < shape.n_layers; ++i) {
    const std::string block = "layers." + std::to_string(i);
    if (sp) plan.add(block + ".attention_norm", SequenceParallel{});
    plan.add(block + ".attention",
             PrepareModuleInput{.input_layout = between, .desired_input_layout = Placement::replicate()});
    for (const std::string& w : shape.head_projections) plan.add(block + ".attention." + w, ColwiseParallel{});
    // These see every rank's input (or one head's features): each rank's gradient is its heads' share.
    for (const std::string& m : shape.replicated_attention) plan.add(block + ".attention." + m, SequenceParallel{});
    plan.add(block + ".attention.wo", RowwiseParallel{.output_layout = between});
    if (sp) plan.add(block + ".ffn_norm", SequenceParallel{});
    if (std::find(shape.moe_layers.begin(), shape.moe_layers.end(), i) != shape.moe_layers.end()) {
      // Routing is per token: this rank's sequence shard through replicated experts, or through experts
      // split over tp, whose gradients are each rank's own (expert parallelism gathers the tokens for them).
      if (sp && !sharded_experts) plan.add(block + ".moe", SequenceParallel{});
      if (sp && sharded_experts) {
        plan.add(block + ".moe.router", SequenceParallel{});
        if (shape.shared_experts) plan.add(block + ".moe.shared_experts", SequenceParallel{});
      }
      continue;
    }
    plan.add(block + ".feed_forward",
             PrepareModuleInput{.input_layout = between, .desired_input_layout = Placement::replicate()});
    for (const char* w : {".feed_forward.w1", ".feed_forward.w3"}) plan.add(block + w, ColwiseParallel{});
    plan.add(block + ".feed_forward.w2", RowwiseParallel{.output_layout = between});
  }
  if (sp) plan.add("norm", SequenceParallel{});
  plan.add("output", ColwiseParallel{.input_layout = between,
                                     .output_layout = loss_parallel ? Placement::shard(-1) : Placement::replicate(),
                                     .loss_parallel = loss_parallel});
  return plan;
}

parallel::ExpertParallelPlan expert_parallel_plan(const DecoderShape& shape, int64_t ep, at::ScalarType compute_dtype,
                                                  int64_t etp) {
  parallel::ExpertParallelPlan plan;
  if (ep == 1 && etp == 1) return plan;
  for (int64_t i : shape.moe_layers) plan.moe_modules.push_back(fmt::format("layers.{}.moe", i));
  plan.compute_dtype = compute_dtype;
  return plan;
}

parallel::PipelineModuleCosts pipeline_costs(const Decoder& model, int64_t seq_len) {
  const DecoderShape& shape = model.shape();
  TITAN_CHECK_VALUE(model.tok_embeddings && model.norm && static_cast<int64_t>(model.layers.size()) == shape.n_layers,
                    "[{}] expected the whole model to weigh its pipeline stages, got a part of {} blocks. Build "
                    "the whole model on the meta device for pipeline_costs.",
                    shape.where, model.layers.size());
  const auto flops = [&](const ParameterGroups& g) {
    const int64_t experts = shape.moe_num_experts > 0 ? g.routed_experts * shape.moe_top_k / shape.moe_num_experts : 0;
    return 6.0 * static_cast<double>(g.dense + g.router + g.shared_experts + experts);
  };
  const double attention = 6.0 * static_cast<double>(shape.n_heads * (shape.head_dim + shape.v_head_dim) * seq_len);
  parallel::PipelineModuleCosts costs;
  for (const auto& block : model.layers) costs.layers.push_back(flops(parameter_groups(*block)) + attention);
  costs.output = flops(parameter_groups(*model.norm));
  costs.output += shape.tied ? 6.0 * static_cast<double>(model.tok_embeddings->weight.numel())
                             : flops(parameter_groups(*model.output));
  return costs;
}

parallel::PipelinePlan pipeline_plan(int64_t n_layers, int64_t pp, const ParallelismConfig& p,
                                     const parallel::PipelineModuleCosts& costs) {
  parallel::PipelinePlan plan{.schedule = p.pipeline_parallel_schedule,
                              .schedule_csv = p.pipeline_parallel_schedule_csv,
                              .microbatch_size = p.pipeline_parallel_microbatch_size,
                              .overlap_f_b = p.pipeline_parallel_expert_parallel_overlap};
  if (p.module_fqns_per_model_part) {
    plan.stages = *p.module_fqns_per_model_part;
    return plan;
  }
  // A CSV program runs several stages per rank, as torchtitan's CSV runtime does.
  const PipelineSchedule shape =
      p.pipeline_parallel_schedule_csv.empty() ? p.pipeline_parallel_schedule : PipelineSchedule::interleaved_1f1b;
  const int64_t stages = parallel::num_pipeline_stages(
      shape, pp, n_layers, p.pipeline_parallel_layers_per_stage.value_or(0),
      p.pipeline_parallel_first_stage_less_layers, p.pipeline_parallel_last_stage_less_layers);
  parallel::PipelineSplit split{.input_modules = {"tok_embeddings"},
                                .output_modules = {"norm", "output"},
                                .first_stage_less_layers = p.pipeline_parallel_first_stage_less_layers,
                                .last_stage_less_layers = p.pipeline_parallel_last_stage_less_layers};
  for (int64_t i = 0; i < n_layers; ++i) split.layer_modules.push_back("layers." + std::to_string(i));
  if (p.pipeline_parallel_split == PipelineSplitBy::flops) {
    TITAN_CHECK_VALUE(static_cast<int64_t>(costs.layers.size()) == n_layers,
                      "[titan::pipeline] expected each of the {} blocks' FLOPs for parallelism.pipeline_parallel_split "
                      "= flops, got {}. Pass models::pipeline_costs(model, seq_len), or set "
                      "parallelism.pipeline_parallel_split = layers.",
                      n_layers, costs.layers.size());
    plan.stages = parallel::balance_pipeline_stages(split, costs, stages);
  } else {
    plan.stages = parallel::split_pipeline_stages(split, stages);
  }
  return plan;
}

parallel::ContextParallelPlan context_parallel_plan(int64_t n_layers, const ParallelismConfig& p) {
  parallel::ContextParallelPlan plan{.load_balance = p.context_parallel_load_balancer.has_value(),
                                     .rotate = p.context_parallel_rotate_method};
  for (int64_t i = 0; i < n_layers; ++i) plan.attention_modules.push_back(fmt::format("layers.{}.attention", i));
  return plan;
}

parallel::ActivationCheckpointPlan activation_checkpoint_plan(int64_t n_layers, const ActivationCheckpointConfig& ac,
                                                              bool has_moe, const char* where) {
  parallel::ActivationCheckpointPlan plan{.preserve_rng_state = ac.preserve_rng_state};
  if (ac.mode == AcMode::none) return plan;
  if (ac.mode == AcMode::memory_budget) {
    throw ConfigError("activation_checkpoint.mode",
                      fmt::format("[{}] expected activation_checkpoint.mode none, full or selective, got "
                                  "memory_budget (torchtitan's compiler-driven policy; titan has no graph compiler). "
                                  "Use full or selective.",
                                  where));
  }
  int64_t every = 1;  // full: every block
  if (ac.mode == AcMode::selective) {
    std::string option = ac.selective_ac_option;
    if (option == "op") {
      option = "1";
      plan.per_op = true;
      // torchtitan's default targets MoE routers; a dense model has none, so only other entries are checked.
      for (const std::string& fqn : ac.per_op_sac_force_recompute_mm_shapes_by_fqns) {
        if (has_moe || fqn != "moe.router.gate") plan.force_recompute_mm.push_back(fqn);
      }
    }
    const bool digits = !option.empty() && option.size() < 10 &&
                        std::all_of(option.begin(), option.end(), [](char c) { return c >= '0' && c <= '9'; });
    every = digits ? std::stoll(option) : 0;
    if (every < 1) {
      throw ConfigError("activation_checkpoint.selective_ac_option",
                        fmt::format("[{}] expected activation_checkpoint.selective_ac_option to be an integer N >= 1 "
                                    "(checkpoint every N-th block) or op, got '{}'.",
                                    where, ac.selective_ac_option));
    }
  }
  // torchtitan counts blocks from 1 and wraps the N-th, 2N-th, ...
  for (int64_t i = 0; i < n_layers; ++i) {
    if ((i + 1) % every == 0) plan.modules.push_back(fmt::format("layers.{}", i));
  }
  return plan;
}

parallel::DataParallelOptions data_parallel_options(const torch::nn::Module& model, const JobConfig& config,
                                                    const dist::Mesh& mesh) {
  const ParallelismConfig& p = config.parallelism;
  parallel::DataParallelOptions dp;
  dp.reshard_after_forward = p.fsdp_reshard_after_forward;
  // torchtitan's default under PP: keep units gathered after forward (no all-gather per microbatch).
  if (mesh.size("pp") > 1 && dp.reshard_after_forward == ReshardAfterForward::default_) {
    dp.reshard_after_forward = ReshardAfterForward::never;
  }
  // FSDP's mixed precision (bf16 gathers and compute, fp32 reduction): by default on GPU; on CPU when
  // training.mixed_precision_param says bfloat16. Without data parallelism the trainer autocasts instead.
  const auto params = model.parameters();
  const bool cuda = !params.empty() && params.front().device().is_cuda();
  dp.param_dtype = scalar_type(mixed_precision_param(config.training, cuda));
  dp.reduce_dtype = scalar_type(config.training.mixed_precision_reduce);
  // torchao's float8 all-gather: the weights of the float8 Linears the converter made (run before this).
  if (config.float8.enable_fsdp_float8_all_gather) {
    dp.float8_all_gather = float8::fsdp_float8_weights(model);
    dp.float8_precompute_scales = config.float8.precompute_float8_dynamic_scale_for_fsdp;
  }
  return dp;
}

parallel::ParallelPlan decoder_parallel_plan(const Decoder& model, const JobConfig& config, const dist::Mesh& mesh) {
  const DecoderShape& shape = model.shape();
  for (const char* axis : {"cp", "pp"}) {
    TITAN_CHECK_NOT_IMPLEMENTED(shape.pipeline_and_context_parallel || mesh.size(axis) == 1,
                                "[{}::parallel_plan] expected {} = 1, got {}: context and pipeline parallelism of "
                                "this model are not built (or not tested) yet. Use data, tensor and expert "
                                "parallelism (parallelism.data_parallel_shard_degree, tensor_parallel_degree, "
                                "expert_parallel_degree).",
                                shape.where, axis, mesh.size(axis));
  }
  const ParallelismConfig& p = config.parallelism;
  parallel::ParallelPlan plan{.data_parallel = {.units = data_parallel_units(shape)}};
  if (mesh.size("tp") > 1) {
    plan.tensor_parallel = tensor_parallel_plan(shape, mesh.size("tp"), /*sequence_parallel=*/true,
                                                /*loss_parallel=*/!p.disable_loss_parallel,
                                                /*sharded_experts=*/mesh.size("etp") > 1);
    plan.tensor_parallel.async = p.enable_async_tensor_parallel;
  }
  if (mesh.size("pp") > 1) {
    parallel::PipelineModuleCosts costs;
    if (p.pipeline_parallel_split == PipelineSplitBy::flops) {
      // A pipeline rank's model is a part; every rank weighs the whole model, built on meta (shapes only).
      const bool whole = static_cast<int64_t>(model.layers.size()) == shape.n_layers && model.tok_embeddings;
      costs = whole ? pipeline_costs(model, model.seq_len())
                    : pipeline_costs(*Decoder::build(config, model.vocab_size(), at::kMeta), model.seq_len());
    }
    plan.pipeline = pipeline_plan(shape.n_layers, mesh.size("pp"), p, costs);
  }
  if (mesh.size("cp") > 1) plan.context_parallel = context_parallel_plan(shape.n_layers, p);
  plan.activation_checkpoint =
      activation_checkpoint_plan(shape.n_layers, config.activation_checkpoint, !shape.moe_layers.empty(), shape.where);
  plan.data_parallel.options = data_parallel_options(model, config, mesh);
  if (!shape.moe_layers.empty()) {
    plan.expert_parallel =
        expert_parallel_plan(shape, mesh.size("ep"), plan.data_parallel.options.param_dtype, mesh.size("etp"));
  }
  return plan;
}

}  // namespace titan::models
