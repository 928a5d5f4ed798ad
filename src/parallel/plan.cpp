// SPDX-License-Identifier: BSD-3-Clause
#include "titan/parallel/plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

namespace titan::parallel {
namespace {

std::string kind_name(const ParallelStyle& style) {
  return std::visit(
      [](const auto& s) -> std::string {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, ColwiseParallel>) return "ColwiseParallel";
        if constexpr (std::is_same_v<S, RowwiseParallel>) return "RowwiseParallel";
        if constexpr (std::is_same_v<S, SequenceParallel>) return "SequenceParallel";
        if constexpr (std::is_same_v<S, PrepareModuleInput>) return "PrepareModuleInput";
        return "PrepareModuleOutput";
      },
      style);
}

}  // namespace

std::string format_as(const ParallelStyle& style) {
  std::string args;
  if (const auto* s = std::get_if<ColwiseParallel>(&style)) {
    args = fmt::format("input={}, output={}{}", s->input_layout.str(), s->output_layout.str(),
                       s->loss_parallel ? ", loss_parallel" : "");
  } else if (const auto* r = std::get_if<RowwiseParallel>(&style)) {
    args = fmt::format("input={}, output={}", r->input_layout.str(), r->output_layout.str());
  } else if (const auto* p = std::get_if<PrepareModuleInput>(&style)) {
    args = fmt::format("input={}, desired={}", p->input_layout.str(), p->desired_input_layout.str());
  } else if (const auto* o = std::get_if<PrepareModuleOutput>(&style)) {
    args = fmt::format("output={}, desired={}", o->output_layout.str(), o->desired_output_layout.str());
  }
  return fmt::format("{}({})", kind_name(style), args);
}

std::string format_as(const ParallelPlan& plan) {
  std::string out;
  for (const auto& [path, style] : plan.tensor_parallel.styles) {
    out += fmt::format("{}: {}\n", path.empty() ? "<root>" : path, format_as(style));
  }
  if (plan.tensor_parallel.async) out += fmt::format("tensor_parallel: async x{}\n", plan.tensor_parallel.async_chunks);
  std::vector<std::string> units;
  for (const auto& unit : plan.data_parallel.units) units.push_back(fmt::format("{}", fmt::join(unit, "+")));
  if (!units.empty()) out += fmt::format("data_parallel units: {}\n", fmt::join(units, ", "));
  if (!plan.pipeline.stages.empty()) {
    const std::string schedule =
        plan.pipeline.schedule_csv.empty() ? fmt::format("{}", plan.pipeline.schedule) : plan.pipeline.schedule_csv;
    out += fmt::format("pipeline: {} stages, {}, microbatch size {}\n", plan.pipeline.stages.size(), schedule,
                       plan.pipeline.microbatch_size);
    for (size_t s = 0; s < plan.pipeline.stages.size(); ++s) {
      out += fmt::format("  stage {}: {}\n", s, fmt::join(plan.pipeline.stages[s], ", "));
    }
  }
  if (!plan.context_parallel.attention_modules.empty()) {
    out += fmt::format("context_parallel: {}\n", fmt::join(plan.context_parallel.attention_modules, ", "));
  }
  if (!plan.expert_parallel.moe_modules.empty()) {
    out += fmt::format("expert_parallel: {}\n", fmt::join(plan.expert_parallel.moe_modules, ", "));
  }
  if (!plan.activation_checkpoint.modules.empty()) {
    const ActivationCheckpointPlan& ac = plan.activation_checkpoint;
    out += fmt::format("activation_checkpoint{}: {}\n", ac.per_op ? " (per op)" : "", fmt::join(ac.modules, ", "));
    if (ac.per_op && !ac.force_recompute_mm.empty()) {
      out +=
          fmt::format("activation_checkpoint recomputes the matmuls of: {}\n", fmt::join(ac.force_recompute_mm, ", "));
    }
  }
  return out;
}

std::vector<std::vector<std::string>> units_per_child(const torch::nn::Module& model) {
  std::vector<std::vector<std::string>> units;
  for (const auto& child : model.named_children()) units.push_back({child.key()});
  return units;
}

}  // namespace titan::parallel
