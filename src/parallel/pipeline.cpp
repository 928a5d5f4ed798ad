// SPDX-License-Identifier: BSD-3-Clause
// Stage placement, the plan's checks and the Pipeline handle; the step runtime is in
// pipeline_runtime.cpp.
#include "titan/parallel/pipeline.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

#include <set>

#include "find_module.hpp"
#include "pipeline_state.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"

namespace titan::parallel {
namespace {

// A CSV program runs on looped placement, as torchtitan's CSV runtime does.
StagePlacement placement(const PipelinePlan& plan) {
  return plan.schedule_csv.empty() ? placement_of(plan.schedule) : StagePlacement::kLooped;
}

std::vector<int64_t> ranks_of_stages(const PipelinePlan& plan, int64_t pp) {
  const auto stages = static_cast<int64_t>(plan.stages.size());
  TITAN_CHECK_VALUE(stages >= pp && stages % pp == 0,
                    "[titan::pipeline] expected a number of stages divisible by the pp degree {}, got {} stages. "
                    "Change parallelism.pipeline_parallel_layers_per_stage or module_fqns_per_model_part.",
                    pp, stages);
  return stage_ranks(placement(plan), pp, stages);
}

}  // namespace

std::vector<int64_t> pipeline_stages(const PipelinePlan& plan, const dist::Mesh& mesh) {
  const std::vector<int64_t> ranks = ranks_of_stages(plan, mesh.size("pp"));
  std::vector<int64_t> mine;
  for (size_t s = 0; s < ranks.size(); ++s) {
    if (ranks[s] == mesh.coordinate("pp")) mine.push_back(static_cast<int64_t>(s));
  }
  return mine;
}

std::vector<std::string> pipeline_modules(const PipelinePlan& plan, const dist::Mesh& mesh) {
  std::vector<std::string> modules;
  for (int64_t s : pipeline_stages(plan, mesh)) {
    for (const auto& path : plan.stages[static_cast<size_t>(s)]) modules.push_back(path);
  }
  return modules;
}

namespace detail {

void validate_pipeline(const torch::nn::Module& model, const PipelinePlan& plan, const dist::Mesh& mesh) {
  const int64_t pp = mesh.size("pp");
  TITAN_CHECK_VALUE(!plan.stages.empty() || pp == 1,
                    "[titan::parallelize] expected plan.pipeline to list stages on a mesh with pp = {}, got none. "
                    "Give the model a pipeline split (e.g. llama3::pipeline_plan) or build the mesh with pp = 1.",
                    pp);
  if (plan.stages.empty()) return;
  TITAN_CHECK_VALUE(plan.microbatch_size >= 1,
                    "[titan::parallelize] expected plan.pipeline.microbatch_size >= 1, got {}. Set "
                    "parallelism.pipeline_parallel_microbatch_size.",
                    plan.microbatch_size);
  const int64_t stages = static_cast<int64_t>(plan.stages.size());
  if (plan.schedule_csv.empty()) {
    const int64_t per_rank = stages / std::max<int64_t>(pp, 1);
    const bool single = is_single_stage(plan.schedule);
    const bool v_shape = placement_of(plan.schedule) == StagePlacement::kVShape;
    TITAN_CHECK_VALUE((single && per_rank == 1 && stages == pp) || (v_shape && stages == 2 * pp) ||
                          (!single && !v_shape && stages % pp == 0 && per_rank >= 2),
                      "[titan::parallelize] expected {} stage(s) per rank for schedule {}, got {} stages on {} ranks. "
                      "{}",
                      single ? "1" : (v_shape ? "exactly 2" : "at least 2"), plan.schedule, stages, pp,
                      single ? "Use a multi-stage schedule (Interleaved1F1B, ...) or fewer stages."
                             : "Change parallelism.pipeline_parallel_layers_per_stage.");
  }
  const auto named = model.named_modules("", /*include_self=*/false);
  const std::vector<int64_t> mine = pipeline_stages(plan, mesh);
  const std::set<int64_t> local(mine.begin(), mine.end());
  std::set<std::string> seen;
  for (int64_t s = 0; s < stages; ++s) {
    for (const auto& path : plan.stages[static_cast<size_t>(s)]) {
      TITAN_CHECK_VALUE(seen.insert(path).second,
                        "[titan::parallelize] expected each module in one pipeline stage, got '{}' again in stage {}. "
                        "Fix module_fqns_per_model_part.",
                        path, s);
      const bool present = named.contains(path);
      TITAN_CHECK_VALUE(present == local.contains(s),
                        "[titan::parallelize] expected pp rank {} to hold exactly its stages' modules {}, got '{}' "
                        "(stage {}) {}. Build the model with parallel::pipeline_modules(plan.pipeline, mesh).",
                        mesh.coordinate("pp"), fmt::join(mine, ","), path, s, present ? "present" : "missing");
    }
  }
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    bool owned = false;
    for (const auto& path : seen) owned = owned || detail::is_under(item.key(), path);
    TITAN_CHECK_VALUE(owned,
                      "[titan::parallelize] expected every parameter in a pipeline stage, got '{}' in none. Add its "
                      "module to a stage.",
                      item.key());
  }
}

std::unique_ptr<Pipeline> apply_pipeline(torch::nn::Module& model, const PipelinePlan& plan, const dist::Mesh& mesh) {
  auto state = std::make_unique<PipelineState>(PipelineState{.plan = plan, .group = mesh.group("pp")});
  state->stage_rank = ranks_of_stages(plan, mesh.size("pp"));
  state->local = pipeline_stages(plan, mesh);
  state->overlap_f_b = plan.overlap_f_b && mesh.size("pp") == mesh.world_size();
  const auto named = model.named_parameters(/*recurse=*/true);
  for (int64_t s : state->local) {
    auto& params = state->params[s];
    for (const auto& item : named) {
      for (const auto& path : plan.stages[static_cast<size_t>(s)]) {
        if (detail::is_under(item.key(), path)) {
          params.push_back(item.value());
          break;
        }
      }
    }
  }
  return std::make_unique<Pipeline>(std::move(state));
}

PipelineProgram build_program(const PipelineState& state, int64_t microbatches) {
  const auto& plan = state.plan;
  const int64_t pp = state.group.size();
  PipelineProgram program = plan.schedule_csv.empty()
                                ? make_pipeline_program(plan.schedule, pp, state.num_stages(), microbatches)
                                : read_pipeline_csv(plan.schedule_csv, pp, microbatches);
  TITAN_CHECK_VALUE(program.num_stages == state.num_stages() && program.stage_rank == state.stage_rank &&
                        program.num_microbatches == microbatches,
                    "[titan::pipeline] expected schedule {} to run {} stages placed on ranks [{}] with {} "
                    "microbatches, got {} stages on ranks [{}] with {}. Make the schedule match the split "
                    "(parallelism.pipeline_parallel_layers_per_stage) and the batch.",
                    program.name, state.num_stages(), fmt::join(state.stage_rank, ","), microbatches,
                    program.num_stages, fmt::join(program.stage_rank, ","), program.num_microbatches);
  validate_pipeline_program(program);
  return program;
}

PipelineProgram forward_only_program(const PipelineState& state, int64_t microbatches) {
  PipelineProgram program{.name = "forward-only",
                          .num_ranks = state.group.size(),
                          .num_stages = state.num_stages(),
                          .num_microbatches = microbatches,
                          .stage_rank = state.stage_rank,
                          .actions = std::vector<std::vector<PipelineAction>>(static_cast<size_t>(state.group.size()))};
  for (int64_t m = 0; m < microbatches; ++m) {
    for (int64_t s = 0; s < state.num_stages(); ++s) {
      program.actions[static_cast<size_t>(state.stage_rank[static_cast<size_t>(s)])].push_back(
          {.op = PipelineAction::Op::kForward, .stage = s, .microbatch = m});
    }
  }
  add_pipeline_communication(program);
  return program;
}

}  // namespace detail

Pipeline::Pipeline(std::unique_ptr<detail::PipelineState> state) : state_(std::move(state)) {}
Pipeline::~Pipeline() = default;

std::string Pipeline::describe() const {
  const auto& plan = state_->plan;
  const bool pairs = plan.schedule_csv.empty() && plan.schedule == PipelineSchedule::dual_pipe_v;
  return fmt::format("PP(pp={}, {}, stages [{}] of {}, microbatch size {}{})", state_->group.size(),
                     plan.schedule_csv.empty() ? fmt::format("{}", plan.schedule) : plan.schedule_csv,
                     fmt::join(state_->local, ","), state_->num_stages(), plan.microbatch_size,
                     !pairs                ? ""
                     : state_->overlap_f_b ? ", F/B pairs overlapped"
                                           : ", F/B pairs sequential");
}

const std::vector<int64_t>& Pipeline::stages() const { return state_->local; }
bool Pipeline::has_first_stage() const { return state_->is_local(0); }
bool Pipeline::has_last_stage() const { return state_->is_local(state_->num_stages() - 1); }

void Pipeline::sum_first_last_stage_grads(const at::Tensor& param) const {
  const int64_t first = state_->stage_rank.front();
  const int64_t last = state_->stage_rank.back();
  const int64_t me = state_->rank();
  if (first == last || (me != first && me != last)) return;
  TITAN_CHECK_VALUE(param.defined(),
                    "[titan::pipeline] expected pp rank {} (it holds the {} stage) to pass its copy of the weight the "
                    "first and last stage share, got none. Pass the parameter this rank holds.",
                    me, me == first ? "first" : "last");
  at::NoGradGuard no_grad;
  if (!param.grad().defined()) param.mutable_grad() = at::zeros_like(param);
  const at::Tensor mine = param.grad().contiguous().clone();  // (param's local shape)
  at::Tensor theirs = at::empty_like(mine);
  // One batch: each side sends and receives without either order hanging. g_first + g_last is g_last + g_first
  // bitwise, so the two copies keep equal gradients.
  state_->group
      .batch_isend_irecv({{.send = true, .tensor = mine, .peer = me == first ? last : first, .tag = 0},
                          {.send = false, .tensor = theirs, .peer = me == first ? last : first, .tag = 0}})
      .wait();
  param.grad().add_(theirs);
}

const PipelineProgram& Pipeline::program(int64_t microbatches) {
  auto it = state_->programs.find(microbatches);
  if (it == state_->programs.end()) {
    it = state_->programs.emplace(microbatches, detail::build_program(*state_, microbatches)).first;
  }
  return it->second;
}

void Pipeline::set_step_end_hook(std::function<void()> hook) { state_->step_end = std::move(hook); }

const PipelineTimeline& Pipeline::last_timeline() const { return state_->timeline; }
const PipelineStats& Pipeline::last_stats() const { return state_->stats; }

}  // namespace titan::parallel
