// SPDX-License-Identifier: BSD-3-Clause
// How many stages a model is cut into, and which modules each stage holds: torchtitan v0.2.2's
// rules (pipeline_parallel.py: the stage count in pipeline_llm, generate_llm_fqn_per_model_part),
// so that a job file splits the model the same way in titan and torchtitan.
#include <fmt/format.h>

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

}  // namespace titan::parallel
