// SPDX-License-Identifier: BSD-3-Clause
// How many stages a model is cut into, and which modules each stage holds: torchtitan v0.2.2's
// rules (pipeline_parallel.py: the stage count in pipeline_llm, generate_llm_fqn_per_model_part),
// so that a job file splits the model the same way in titan and torchtitan; and titan's split by cost
// (parallelism.pipeline_parallel_split = flops), which torchtitan has only as an experiment
// (experiments/autopartition, from profiled layer times).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>
#include <map>

#include "pipeline_internal.hpp"
#include "titan/core/error.hpp"

namespace titan::parallel {

int64_t num_pipeline_stages(PipelineSchedule schedule, int64_t pp, int64_t layers, int64_t layers_per_stage,
                            int64_t first_stage_less_layers, int64_t last_stage_less_layers) {
  TITAN_CHECK_VALUE(pp >= 1, "[titan::pipeline] expected parallelism.pipeline_parallel_degree >= 1, got {}.", pp);
  const bool single = is_single_stage(schedule);
  const std::string_view name = choice_name(schedule);
  if (layers_per_stage <= 0) return pp * (single ? 1 : 2);
  const int64_t effective = layers + first_stage_less_layers + last_stage_less_layers;
  const int64_t stages = (effective + layers_per_stage - 1) / layers_per_stage;
  const std::string model = fmt::format(
      "{} layers + first_stage_less_layers {} + last_stage_less_layers {} with "
      "pipeline_parallel_layers_per_stage {} make {} stages",
      layers, first_stage_less_layers, last_stage_less_layers, layers_per_stage, stages);
  TITAN_CHECK_VALUE(stages % pp == 0,
                    "[titan::pipeline] expected the number of stages to be a multiple of "
                    "parallelism.pipeline_parallel_degree ({}), got {}: {}. Change "
                    "parallelism.pipeline_parallel_layers_per_stage.",
                    pp, stages, model);
  const int64_t per_rank = stages / pp;
  TITAN_CHECK_VALUE(!single || per_rank == 1,
                    "[titan::pipeline] {} runs one stage per rank: expected {} stages, got {} ({}). Raise "
                    "parallelism.pipeline_parallel_layers_per_stage to {} or more, or unset it.",
                    name, pp, stages, model, layers / pp);
  TITAN_CHECK_VALUE(single || per_rank >= 2,
                    "[titan::pipeline] {} runs several stages per rank: expected at least {} stages, got {} ({}). "
                    "Lower parallelism.pipeline_parallel_layers_per_stage.",
                    name, 2 * pp, stages, model);
  TITAN_CHECK_VALUE(placement_of(schedule) == StagePlacement::kLooped || per_rank == 2,
                    "[titan::pipeline] {} places stages in a V, two per rank: expected {} stages, got {} ({}). "
                    "Change parallelism.pipeline_parallel_layers_per_stage.",
                    name, 2 * pp, stages, model);
  return stages;
}

std::vector<std::vector<std::string>> split_pipeline_stages(const PipelineSplit& split, int64_t stages) {
  TITAN_CHECK_VALUE(stages >= 1, "[titan::pipeline] expected at least 1 stage, got {}.", stages);
  const auto layers = static_cast<int64_t>(split.layer_modules.size());
  const int64_t in_w = split.first_stage_less_layers;
  const int64_t out_w = split.last_stage_less_layers;
  std::vector<std::vector<std::string>> parts(static_cast<size_t>(stages));
  const auto append = [](std::vector<std::string>& to, const std::vector<std::string>& from) {
    to.insert(to.end(), from.begin(), from.end());
  };
  if (stages == 1) {
    append(parts[0], split.input_modules);
    append(parts[0], split.layer_modules);
    append(parts[0], split.output_modules);
    return parts;
  }
  // The input and output modules count as in_w and out_w layers; the effective layers are spread
  // evenly, the first (effective % stages) stages taking one more.
  const int64_t effective = layers + in_w + out_w;
  const int64_t per = effective / stages;
  TITAN_CHECK_VALUE(per >= 1,
                    "[titan::pipeline] expected at least one layer per stage, got stage {} without one: {} stages "
                    "for {} effective layers ({} layers + first_stage_less_layers {} + last_stage_less_layers {}). "
                    "Use fewer stages (raise parallelism.pipeline_parallel_layers_per_stage).",
                    stages - 1, stages, effective, layers, in_w, out_w);
  TITAN_CHECK_VALUE(in_w <= per,
                    "[titan::pipeline] expected parallelism.pipeline_parallel_first_stage_less_layers ({}) <= the "
                    "layers per stage ({}), got more: stage 0 would hold fewer than no layers. Lower it or use "
                    "fewer stages.",
                    in_w, per);
  TITAN_CHECK_VALUE(out_w <= per,
                    "[titan::pipeline] expected parallelism.pipeline_parallel_last_stage_less_layers ({}) <= the "
                    "layers per stage ({}), got more: stage {} would hold fewer than no layers. Lower it or use "
                    "fewer stages.",
                    out_w, per, stages - 1);
  const int64_t extra = effective % stages;
  int64_t next = 0;
  for (int64_t s = 0; s < stages; ++s) {
    auto& part = parts[static_cast<size_t>(s)];
    int64_t take = per + (s < extra ? 1 : 0);
    if (s == 0) append(part, split.input_modules), take -= in_w;
    if (s == stages - 1) take -= out_w;
    for (; take > 0 && next < layers; --take) part.push_back(split.layer_modules[static_cast<size_t>(next++)]);
    if (s == stages - 1) append(part, split.output_modules);
  }
  return parts;
}

namespace {

/// The split's modules as the units a cost cut moves whole: the input modules, each layer, the output modules.
struct CostItem {
  std::vector<std::string> modules;
  double cost = 0;
};

std::vector<CostItem> cost_items(const PipelineSplit& split, const PipelineModuleCosts& costs) {
  TITAN_CHECK_VALUE(costs.layers.size() == split.layer_modules.size(),
                    "[titan::pipeline] expected one cost per layer module ({}), got {}. Give "
                    "PipelineModuleCosts::layers one entry per PipelineSplit::layer_modules.",
                    split.layer_modules.size(), costs.layers.size());
  std::vector<CostItem> items;
  if (!split.input_modules.empty()) items.push_back({split.input_modules, costs.input});
  for (size_t i = 0; i < split.layer_modules.size(); ++i) items.push_back({{split.layer_modules[i]}, costs.layers[i]});
  if (!split.output_modules.empty()) items.push_back({split.output_modules, costs.output});
  for (const CostItem& item : items) {
    TITAN_CHECK_VALUE(std::isfinite(item.cost) && item.cost >= 0,
                      "[titan::pipeline] expected a finite cost >= 0 for every module, got {} for {}.", item.cost,
                      fmt::join(item.modules, "+"));
  }
  return items;
}

}  // namespace

std::vector<std::vector<std::string>> balance_pipeline_stages(const PipelineSplit& split,
                                                              const PipelineModuleCosts& costs, int64_t stages) {
  const std::vector<CostItem> items = cost_items(split, costs);
  const auto n = static_cast<int64_t>(items.size());
  TITAN_CHECK_VALUE(stages >= 1 && stages <= n,
                    "[titan::pipeline] expected between 1 and {} stages (the input modules, {} layers and the "
                    "output modules, one or more per stage), got {}. Use fewer stages (raise "
                    "parallelism.pipeline_parallel_layers_per_stage) or a model with more layers.",
                    n, split.layer_modules.size(), stages);
  std::vector<double> prefix(static_cast<size_t>(n + 1), 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + items[static_cast<size_t>(i)].cost;
  // Cost of items [j, i). Both passes below compute it the same way, so comparing against the first
  // pass's optimum is exact.
  const auto segment = [&](int64_t j, int64_t i) { return prefix[i] - prefix[j]; };
  constexpr double kNone = std::numeric_limits<double>::infinity();
  const auto at = [n](std::vector<double>& table, int64_t s, int64_t i) -> double& {
    return table[static_cast<size_t>(s * (n + 1) + i)];
  };
  // Pass 1: worst[s][i], the least possible largest stage when s stages hold the first i items.
  std::vector<double> worst(static_cast<size_t>((stages + 1) * (n + 1)), kNone);
  at(worst, 0, 0) = 0;
  for (int64_t s = 1; s <= stages; ++s) {
    for (int64_t i = s; i <= n; ++i) {
      for (int64_t j = s - 1; j < i; ++j)
        at(worst, s, i) = std::min(at(worst, s, i), std::max(at(worst, s - 1, j), segment(j, i)));
    }
  }
  const double bound = at(worst, stages, n);
  // Pass 2: among cuts whose stages all stay within that bound, the least sum of squares.
  std::vector<double> squares(worst.size(), kNone);
  std::vector<int64_t> cut(worst.size(), -1);
  at(squares, 0, 0) = 0;
  for (int64_t s = 1; s <= stages; ++s) {
    for (int64_t i = s; i <= n; ++i) {
      for (int64_t j = s - 1; j < i; ++j) {
        const double c = segment(j, i);
        if (c > bound || at(squares, s - 1, j) == kNone) continue;
        const double total = at(squares, s - 1, j) + c * c;
        if (total < at(squares, s, i)) at(squares, s, i) = total, cut[static_cast<size_t>(s * (n + 1) + i)] = j;
      }
    }
  }
  std::vector<std::vector<std::string>> parts(static_cast<size_t>(stages));
  for (int64_t s = stages, i = n; s >= 1; --s) {
    const int64_t j = cut[static_cast<size_t>(s * (n + 1) + i)];
    auto& part = parts[static_cast<size_t>(s - 1)];
    for (int64_t k = j; k < i; ++k) {
      const auto& modules = items[static_cast<size_t>(k)].modules;
      part.insert(part.end(), modules.begin(), modules.end());
    }
    i = j;
  }
  return parts;
}

std::vector<double> pipeline_stage_costs(const PipelineSplit& split, const PipelineModuleCosts& costs,
                                         const std::vector<std::vector<std::string>>& stages) {
  std::map<std::string, double> cost_of;  // a group's cost on its first module, 0 on the others
  for (const CostItem& item : cost_items(split, costs)) {
    for (size_t k = 0; k < item.modules.size(); ++k) cost_of[item.modules[k]] = k == 0 ? item.cost : 0.0;
  }
  std::vector<double> out;
  for (const auto& stage : stages) {
    double total = 0;
    for (const std::string& module : stage) {
      const auto it = cost_of.find(module);
      TITAN_CHECK_VALUE(it != cost_of.end(),
                        "[titan::pipeline] expected stage modules from the split's input, layer and output modules, "
                        "got '{}'.",
                        module);
      total += it->second;
    }
    out.push_back(total);
  }
  return out;
}

}  // namespace titan::parallel
