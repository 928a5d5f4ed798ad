// SPDX-License-Identifier: BSD-3-Clause
#include "titan/parallel/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/parallel/pipeline_schedule.hpp"

namespace titan::parallel {
namespace {

const RefusedAxis* refusal(const ShardingSpec& spec, std::string_view axis) {
  const auto it = std::find_if(spec.refused.begin(), spec.refused.end(), [&](const auto& r) { return r.axis == axis; });
  return it == spec.refused.end() ? nullptr : &*it;
}

void check_axes(const ShardingSpec& spec, const dist::MeshShape& mesh) {
  const std::pair<const char*, int64_t> axes[] = {
      {"tp", mesh.tp}, {"cp", mesh.cp}, {"pp", mesh.pp}, {"ep", mesh.ep}, {"etp", mesh.etp}};
  for (const auto& [axis, size] : axes) {
    const RefusedAxis* r = refusal(spec, axis);
    TITAN_CHECK_NOT_IMPLEMENTED(size == 1 || r == nullptr, "[{}::plan] expected {} = 1, got {}: {}", spec.model, axis,
                                size, r == nullptr ? "" : r->reason);
  }
  // Before the pipeline modules: declaring them would not help.
  TITAN_CHECK_NOT_IMPLEMENTED(mesh.pp == 1 || spec.tied.empty(),
                              "[{}::plan] expected no tied weights under pipeline parallelism, got {} -> {} with pp = "
                              "{}: the first and last stage would share one tensor. Untie them (a head of its own), or "
                              "set parallelism.pipeline_parallel_degree 1.",
                              spec.model, spec.tied.empty() ? "" : spec.tied.front().first,
                              spec.tied.empty() ? "" : spec.tied.front().second, mesh.pp);
  TITAN_CHECK_VALUE(mesh.pp == 1 || !spec.pipeline.layer_modules.empty(),
                    "[{}::plan] expected the modules a pipeline may cut between (ShardingSpec::pipeline), got none "
                    "with pp = {}. Declare them in the model's sharding spec, or set "
                    "parallelism.pipeline_parallel_degree 1.",
                    spec.model, mesh.pp);
  TITAN_CHECK_VALUE(mesh.cp == 1 || !spec.attention.empty(),
                    "[{}::plan] expected attention modules (ShardingSpec::attention) for context parallelism, got none "
                    "with cp = {}. Declare them in the model's sharding spec, or set "
                    "parallelism.context_parallel_degree 1.",
                    spec.model, mesh.cp);
  TITAN_CHECK_VALUE((mesh.ep == 1 && mesh.etp == 1) || !spec.moe.empty(),
                    "[{}::plan] expected MoE layers (ShardingSpec::moe) for expert parallelism, got none with ep = {} "
                    "and etp = {}. Set parallelism.expert_parallel_degree and expert_tensor_parallel_degree 1 for a "
                    "model without MoE layers.",
                    spec.model, mesh.ep, mesh.etp);
}

ParallelStyle style_of(TensorParallelRole role, const Placement& between, bool loss_parallel) {
  switch (role) {
    case TensorParallelRole::colwise:
      return ColwiseParallel{};
    case TensorParallelRole::rowwise:
      return RowwiseParallel{.output_layout = between};
    case TensorParallelRole::vocab_embedding:
      return RowwiseParallel{.input_layout = Placement::replicate(), .output_layout = between};
    case TensorParallelRole::position_embedding:
      return PrepareModuleOutput{.output_layout = Placement::replicate(), .desired_output_layout = between};
    case TensorParallelRole::sequence_norm:
    case TensorParallelRole::replicated:
    case TensorParallelRole::moe:
      return SequenceParallel{};
    case TensorParallelRole::module_input:
      return PrepareModuleInput{.input_layout = between, .desired_input_layout = Placement::replicate()};
    case TensorParallelRole::head:
      return ColwiseParallel{.input_layout = between,
                             .output_layout = loss_parallel ? Placement::shard(-1) : Placement::replicate(),
                             .loss_parallel = loss_parallel};
  }
  throw std::invalid_argument(
      fmt::format("[titan::parallel::plan] expected a tensor-parallel role, got {}.", static_cast<int>(role)));
}

// The role spec gives the module of `fqn` (a parameter's name: its module is what precedes the last '.').
std::optional<TensorParallelRole> role_of_owner(const ShardingSpec& spec, const std::string& fqn) {
  const std::string module = fqn.substr(0, fqn.rfind('.') == std::string::npos ? 0 : fqn.rfind('.'));
  const auto it = std::find_if(spec.tensor_parallel.begin(), spec.tensor_parallel.end(),
                               [&](const auto& e) { return e.first == module; });
  return it == spec.tensor_parallel.end() ? std::nullopt : std::optional<TensorParallelRole>(it->second);
}

// One vocabulary split serves a tied pair: the embedding's rows over tp are the head's output features over tp.
void check_tied(const ShardingSpec& spec, const std::string& user, const std::string& owner) {
  TITAN_CHECK_NOT_IMPLEMENTED(role_of_owner(spec, user) == TensorParallelRole::head &&
                                  role_of_owner(spec, owner) == TensorParallelRole::vocab_embedding,
                              "[{}::plan] expected a head module declared for the tied weights {} -> {} under tensor "
                              "parallelism (the user's module with TensorParallelRole::head, e.g. an nn::TiedLinear, "
                              "the owner's with vocab_embedding), got other roles: the output projection would have no "
                              "vocab-parallel form. Declare both roles, or untie the weights.",
                              spec.model, user, owner);
}

}  // namespace

TensorParallelPlan tensor_parallel_plan(const ShardingSpec& spec, int64_t degree, bool sequence_parallel,
                                        bool loss_parallel, bool sharded_experts) {
  for (const auto& [what, count] : spec.tensor_parallel_divides) {
    TITAN_CHECK_VALUE(count % degree == 0,
                      "[{}::plan] expected {} ({}) divisible by the tensor-parallel degree {}. Choose a degree that "
                      "divides it.",
                      spec.model, what, count, degree);
  }
  for (const auto& [user, owner] : spec.tied) check_tied(spec, user, owner);
  // Between blocks activations are sequence-sharded (SP) or replicated; inside attention and the feed-forward
  // they are replicated over the sequence and sharded over heads / hidden features.
  const Placement between = sequence_parallel ? Placement::shard(1) : Placement::replicate();
  TensorParallelPlan plan;
  for (const auto& [path, role] : spec.tensor_parallel) {
    // Without sequence parallelism the residual stream is replicated: these roles have nothing to redistribute.
    if ((role == TensorParallelRole::sequence_norm || role == TensorParallelRole::moe ||
         role == TensorParallelRole::position_embedding) &&
        !sequence_parallel) {
      continue;
    }
    if (role == TensorParallelRole::moe && sharded_experts) {
      // Routing is per token: this rank's sequence shard through experts split over tp, whose gradients are each
      // rank's own (expert parallelism gathers the tokens for them); only the router and shared experts are whole.
      const auto it =
          std::find_if(spec.moe.begin(), spec.moe.end(), [&](const MoeModule& m) { return m.path == path; });
      TITAN_CHECK_VALUE(it != spec.moe.end(),
                        "[{}::plan] expected the tensor-parallel MoE module '{}' in ShardingSpec::moe, got no such "
                        "entry. List it there with its replicated parts.",
                        spec.model, path);
      for (const std::string& part : it->replicated) plan.add(path + "." + part, SequenceParallel{});
      continue;
    }
    plan.add(path, style_of(role, between, loss_parallel));
  }
  for (const auto& [path, style] : spec.tensor_parallel_styles) plan.add(path, style);
  return plan;
}

PipelinePlan pipeline_plan(const PipelineSplit& split, const PipelineModuleCosts& costs, int64_t pp,
                           const ParallelismConfig& p, const std::string& model) {
  PipelinePlan plan{.schedule = p.pipeline_parallel_schedule,
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
  const auto n_layers = static_cast<int64_t>(split.layer_modules.size());
  const int64_t stages =
      num_pipeline_stages(shape, pp, n_layers, p.pipeline_parallel_layers_per_stage.value_or(0),
                          p.pipeline_parallel_first_stage_less_layers, p.pipeline_parallel_last_stage_less_layers);
  PipelineSplit cut = split;
  cut.first_stage_less_layers = p.pipeline_parallel_first_stage_less_layers;
  cut.last_stage_less_layers = p.pipeline_parallel_last_stage_less_layers;
  if (p.pipeline_parallel_split == PipelineSplitBy::flops) {
    TITAN_CHECK_VALUE(static_cast<int64_t>(costs.layers.size()) == n_layers,
                      "[{}::plan] expected each of the {} blocks' FLOPs for parallelism.pipeline_parallel_split = "
                      "flops, got {}. Give the sharding spec its pipeline_costs (a model built whole, on meta, knows "
                      "them), or set parallelism.pipeline_parallel_split = layers.",
                      model, n_layers, costs.layers.size());
    plan.stages = balance_pipeline_stages(cut, costs, stages);
  } else {
    plan.stages = split_pipeline_stages(cut, stages);
  }
  return plan;
}

namespace {

// A model whose attention only Ulysses splits over cp (per-head sinks, sliding windows) refuses the K/V exchanges.
void check_kv_exchange(const ShardingSpec& spec, const ParallelismConfig& p, const dist::MeshShape& mesh) {
  const RefusedAxis* r = refusal(spec, "cp_kv");
  TITAN_CHECK_NOT_IMPLEMENTED(
      mesh.cp == 1 || r == nullptr || p.context_parallel_rotate_method == CpRotateMethod::ulysses,
      "[{}::plan] expected cp = 1 under context_parallel_rotate_method {}, got {}: {}", spec.model,
      p.context_parallel_rotate_method, mesh.cp, r == nullptr ? "" : r->reason);
}

// A model with a recurrence across the cp ranks (Gated DeltaNet's state passing) needs each rank's tokens contiguous.
void check_load_balance(const ShardingSpec& spec, const ParallelismConfig& p, const dist::MeshShape& mesh) {
  const RefusedAxis* r = refusal(spec, "cp_load_balance");
  TITAN_CHECK_NOT_IMPLEMENTED(mesh.cp == 1 || r == nullptr || !p.context_parallel_load_balancer.has_value(),
                              "[{}::plan] expected parallelism.context_parallel_load_balancer None under cp = {}, got "
                              "headtail: {}",
                              spec.model, mesh.cp, r == nullptr ? "" : r->reason);
}

// Ulysses hands every cp rank whole heads of the tp rank's share (KV heads are repeated where cp does not divide
// them, so only the query heads bind).
void check_ulysses_heads(const ShardingSpec& spec, const ParallelismConfig& p, const dist::MeshShape& mesh) {
  for (const auto& [what, count] : spec.tensor_parallel_divides) {
    TITAN_CHECK_VALUE(p.context_parallel_rotate_method != CpRotateMethod::ulysses || what != "n_heads" ||
                          count % (mesh.tp * mesh.cp) == 0,
                      "[{}::plan] expected {} ({}) divisible by parallelism.tensor_parallel_degree x "
                      "context_parallel_degree = {} x {} under context_parallel_rotate_method ulysses (each cp rank "
                      "attends whole heads). Choose degrees whose product divides it, or set "
                      "parallelism.context_parallel_rotate_method allgather.",
                      spec.model, what, count, mesh.tp, mesh.cp);
  }
}

}  // namespace

ContextParallelPlan context_parallel_plan(const std::vector<std::string>& attention, const ParallelismConfig& p) {
  return {.attention_modules = attention,
          .load_balance = p.context_parallel_load_balancer.has_value(),
          .rotate = p.context_parallel_rotate_method};
}

ActivationCheckpointPlan activation_checkpoint_plan(const std::vector<std::string>& blocks,
                                                    const ActivationCheckpointConfig& ac, bool has_moe,
                                                    const std::string& model) {
  ActivationCheckpointPlan plan{.preserve_rng_state = ac.preserve_rng_state};
  if (ac.mode == AcMode::none) return plan;
  if (ac.mode == AcMode::memory_budget) {
    throw ConfigError("activation_checkpoint.mode",
                      fmt::format("[{}] expected activation_checkpoint.mode none, full or selective, got "
                                  "memory_budget (torchtitan's compiler-driven policy; titan has no graph compiler). "
                                  "Use full or selective.",
                                  model));
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
                                    model, ac.selective_ac_option));
    }
  }
  // torchtitan counts blocks from 1 and wraps the N-th, 2N-th, ...
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (static_cast<int64_t>(i + 1) % every == 0) plan.modules.push_back(blocks[i]);
  }
  return plan;
}

ExpertParallelPlan expert_parallel_plan(const std::vector<MoeModule>& moe, int64_t ep, int64_t etp,
                                        at::ScalarType compute_dtype) {
  ExpertParallelPlan plan;
  if (ep == 1 && etp == 1) return plan;
  for (const MoeModule& m : moe) plan.moe_modules.push_back(m.path);
  plan.compute_dtype = compute_dtype;
  return plan;
}

DataParallelOptions data_parallel_options(const ParallelismConfig& p, const PrecisionPolicy& precision, int64_t pp) {
  DataParallelOptions dp{.reshard_after_forward = p.fsdp_reshard_after_forward,
                         .param_dtype = precision.param_dtype,
                         .reduce_dtype = precision.reduce_dtype,
                         .float8_all_gather = precision.float8_all_gather,
                         .float8_precompute_scales = precision.float8_precompute_scales};
  // torchtitan's default under PP: keep units gathered after forward (no all-gather per microbatch).
  if (pp > 1 && dp.reshard_after_forward == ReshardAfterForward::default_) {
    dp.reshard_after_forward = ReshardAfterForward::never;
  }
  return dp;
}

ParallelPlan plan(const ShardingSpec& spec, const PlanOptions& options, const dist::MeshShape& mesh) {
  check_axes(spec, mesh);
  const ParallelismConfig& p = options.parallelism;
  ParallelPlan plan{.data_parallel = {.units = spec.fsdp_units}};
  if (mesh.tp > 1) {
    plan.tensor_parallel = tensor_parallel_plan(spec, mesh.tp, spec.sequence_parallel,
                                                /*loss_parallel=*/!p.disable_loss_parallel,
                                                /*sharded_experts=*/mesh.etp > 1);
    plan.tensor_parallel.async = p.enable_async_tensor_parallel;
  }
  if (mesh.pp > 1) plan.pipeline = pipeline_plan(spec.pipeline, spec.pipeline_costs, mesh.pp, p, spec.model);
  if (mesh.cp > 1) {
    check_kv_exchange(spec, p, mesh);
    check_load_balance(spec, p, mesh);
    check_ulysses_heads(spec, p, mesh);
    plan.context_parallel = context_parallel_plan(spec.attention, p);
  }
  plan.activation_checkpoint =
      activation_checkpoint_plan(spec.blocks, options.activation_checkpoint, !spec.moe.empty(), spec.model);
  plan.data_parallel.options = data_parallel_options(p, options.precision, mesh.pp);
  plan.expert_parallel = expert_parallel_plan(spec.moe, mesh.ep, mesh.etp, options.precision.param_dtype);
  return plan;
}

}  // namespace titan::parallel
