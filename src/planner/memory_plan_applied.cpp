// SPDX-License-Identifier: BSD-3-Clause
// The job's plan, applied: what the Trainer does on each rank (build the rank's modules, run titan::parallelize), done
// on the meta device over a planning mesh (dist::Mesh::virtual_mesh) of the layout's shape, so nothing is allocated and
// nobody is met. What the planner reads afterwards is what parallelize left: each parameter's local storage (TP's and
// EP's shards, FSDP's padded rows), the data-parallel units with what their all-gathers land and which weights travel
// in float8, and whether gradients wait for the step's end. A new parallel feature therefore reaches the plan by being
// applied, never by a rule restated here.
//
// One rank per pp stage group is applied: every other rank of a stage group holds the same bytes. TP needs the
// degree to divide what it splits (parallel::plan and parallelize refuse otherwise), EP the experts, and FSDP
// pads every shard to the same ceil(rows / n) rows, so the ranks of one pp rank differ in which rows they hold,
// never in how many (tests/planner/memory_applied_test.cpp checks every rank of real meshes).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <unordered_set>

#include "memory_plan_detail.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/lora.hpp"
#include "titan/parallel/data_parallel.hpp"
#include "titan/parallel/expert_parallel.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/quant/qlora.hpp"

namespace titan::planner::detail {
namespace {

// The top-level module of a path: "layers.3" of "layers.3.moe.experts", "norm" of "norm".
std::string top_level(const std::string& path) {
  const size_t dot = path.find('.');
  if (dot == std::string::npos) return path;
  if (path.compare(0, dot, "layers") != 0) return path.substr(0, dot);
  return path.substr(0, path.find('.', dot + 1));
}

HeldUnit held_unit(const parallel::DataParallelUnit& unit, bool experts) {
  HeldUnit h{.name = unit.name, .experts = experts};
  h.layer = models::ModelParts::layer_index(top_level(unit.name.substr(0, unit.name.find('+'))));
  h.shared_experts = unit.name.find(".moe.shared_experts") != std::string::npos;
  for (const parallel::DataParallelParam& p : unit.params) {
    h.gathered_numel += p.gathered_numel;
    if (p.trained) h.trained_numel += p.gathered_numel;
    if (p.float8) h.float8_numel += p.gathered_numel;
    h.largest_numel = std::max(h.largest_numel, p.gathered_numel);
  }
  return h;
}

// The rank's units in the plan's forward order (an MoE block's experts after its dense unit), the root last.
void sort_units(const parallel::ParallelPlan& plan, std::vector<HeldUnit>& units) {
  std::map<std::string, size_t> order;
  for (size_t u = 0; u < plan.data_parallel.units.size(); ++u)
    order.emplace(fmt::format("{}", fmt::join(plan.data_parallel.units[u], "+")), u);
  auto position = [&](const HeldUnit& h) {
    const auto it = order.find(h.name);
    return it == order.end() ? order.size() : it->second;
  };
  std::stable_sort(units.begin(), units.end(),
                   [&](const HeldUnit& a, const HeldUnit& b) { return position(a) < position(b); });
}

RankShards read_rank(const models::Decoder& model, const Parallelized& applied, const parallel::ParallelPlan& plan,
                     std::vector<std::string> modules) {
  RankShards r{.modules = std::move(modules)};
  std::unordered_set<const c10::TensorImpl*> experts;
  if (const parallel::ExpertParallel* ep = applied.expert_parallel()) {
    for (const at::Tensor& p : ep->expert_parameters()) experts.insert(p.unsafeGetTensorImpl());
  }
  for (const at::Tensor& p : model.unique_parameters()) {
    r.local_numel += p.numel();
    if (experts.contains(p.unsafeGetTensorImpl())) r.expert_numel += p.numel();
    ++r.tensors;
    if (!p.requires_grad()) continue;
    r.trained_numel += p.numel();
    ++r.trained_tensors;
  }
  for (const parallel::DataParallel* dp : {applied.data_parallel(), applied.expert_data_parallel()}) {
    if (dp == nullptr) continue;
    for (const parallel::DataParallelUnit& unit : dp->units()) {
      r.units.push_back(held_unit(unit, dp == applied.expert_data_parallel()));
      if (dp->defers_gradient_sync()) r.deferred_numel += r.units.back().trained_numel;
    }
  }
  sort_units(plan, r.units);
  return r;
}

// The whole model's top-level modules, in forward order.
std::vector<std::string> whole_modules(const parallel::ShardingSpec& spec) {
  std::vector<std::string> all = spec.pipeline.input_modules;
  all.insert(all.end(), spec.pipeline.layer_modules.begin(), spec.pipeline.layer_modules.end());
  all.insert(all.end(), spec.pipeline.output_modules.begin(), spec.pipeline.output_modules.end());
  return all;
}

// As the Trainer builds a rank's model (RankModel): its stages' modules, LoRA's adapters, then the plan applied. float8
// changes how a Linear computes, not what it holds: what FSDP gathers in float8 is the plan's list, made from the whole
// model converted (make_context). lora adds parameters and freezes the rest: only the adapters get gradients and
// optimizer state; with lora.quantize_base the adapted Linears' bases are held in NF4.
RankShards apply_rank(const Context& c, const parallel::ParallelPlan& plan, const dist::MeshShape& mesh,
                      int64_t pp_rank) {
  const dist::Mesh rank_mesh = dist::Mesh::virtual_mesh(mesh, pp_rank * (mesh.world_size() / mesh.pp));
  const std::vector<std::string> modules =
      plan.pipeline.stages.empty() ? std::vector<std::string>{} : parallel::pipeline_modules(plan.pipeline, rank_mesh);
  const std::shared_ptr<models::Decoder> model = c.state.build(modules);
  if (lora_converted(c.config)) {
    nn::LoraOptions lora = nn::lora_options(c.config.lora);
    lora.require_matches = modules.empty();  // a stage may hold none of an entry's Linears
    nn::add_lora(*model, lora);
  }
  const Parallelized applied = titan::parallelize(*model, rank_mesh, plan);
  RankShards held = read_rank(*model, applied, plan, modules.empty() ? whole_modules(c.spec) : modules);
  // QLoRA's bases: named here, held in NF4 (rank_plan). A layout that shards them is refused, naming the weight.
  if (lora_converted(c.config) && c.config.lora.quantize_base) {
    for (const auto& [path, linear] : quant::lora_base_linears(*model))
      held.nf4_numels.push_back(linear->weight.numel());
  }
  return held;
}

}  // namespace

const std::vector<RankShards>& applied_shards(const Context& c, const parallel::ParallelPlan& plan,
                                              const dist::MeshShape& mesh) {
  const ShardKey key{.mesh = {mesh.pp, mesh.dp_replicate, mesh.dp_shard * mesh.cp, mesh.tp, mesh.ep, mesh.etp},
                     .stages = plan.pipeline.stages,
                     .schedule = plan.pipeline.schedule_csv.empty() ? fmt::format("{}", plan.pipeline.schedule)
                                                                    : plan.pipeline.schedule_csv,
                     .float8 = plan.data_parallel.options.float8_all_gather,
                     .lora = lora_converted(c.config) ? to_json(c.config).at("lora").dump() : std::string()};
  auto it = c.state.applied.find(key);
  if (it != c.state.applied.end()) return it->second;
  std::vector<RankShards> ranks;
  for (int64_t r = 0; r < mesh.pp; ++r) ranks.push_back(apply_rank(c, plan, mesh, r));
  return c.state.applied.emplace(key, std::move(ranks)).first->second;
}

}  // namespace titan::planner::detail
