// SPDX-License-Identifier: BSD-3-Clause
// One rank's communication buffers, modelled on the units parallelize left (memory_plan_applied.cpp): FSDP's
// gathered units in flight under the plan's reshard policy, the recompute's gather, on GPU the flat collectives'
// buffers (HSDP/DDP's all-reduce input), and the pipeline's receive buffers. Checked against titan's tracker on
// CPU layouts (docs/memory_planner.md, "Accuracy").
#include <algorithm>
#include <vector>

#include "memory_plan_detail.hpp"

namespace titan::planner::detail {
namespace {

// Each chain of units (the dense one, and the experts' own under EP over efsdp) holds the unit in use and the
// one it prefetches (in forward the next, in backward the previous); walking the units in both directions finds
// the moment both chains hold most. `transient`: what gathering a unit adds while it runs.
int64_t chains_in_flight(const std::vector<HeldUnit>& units, const std::vector<int64_t>& gathered,
                         const std::vector<int64_t>& transient) {
  const auto n = static_cast<int64_t>(units.size());
  auto on_chain = [&](int64_t u, bool experts) { return units[static_cast<size_t>(u)].experts == experts; };
  int64_t most = 0;
  for (const int64_t step : {int64_t{1}, int64_t{-1}}) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t held = 0, extra = 0;
      for (const bool experts : {false, true}) {
        int64_t cur = i;  // the chain's unit in use at i: the last one reached
        while (cur >= 0 && cur < n && !on_chain(cur, experts)) cur -= step;
        if (cur < 0 || cur >= n) continue;
        int64_t next = cur + step;  // and the one it prefetches
        while (next >= 0 && next < n && !on_chain(next, experts)) next += step;
        for (const int64_t u : {cur, next}) {
          if (u < 0 || u >= n) continue;
          held += gathered[static_cast<size_t>(u)];
          extra = std::max(extra, transient[static_cast<size_t>(u)]);
        }
      }
      most = std::max(most, held + extra);
    }
  }
  return most;
}

// An MoE block whose shared experts run after the routed ones: its backward starts in the dense unit (the shared
// experts), which prefetches the unit before it (the previous block's experts), and then gathers its own routed
// experts: three units at once.
int64_t shared_experts_in_flight(const std::vector<HeldUnit>& units, const std::vector<int64_t>& gathered,
                                 const std::vector<int64_t>& transient) {
  int64_t most = 0;
  for (size_t u = 2; u < units.size(); ++u) {
    if (!units[u - 1].shared_experts || !units[u].name.ends_with(".moe.experts")) continue;
    most = std::max(most, gathered[u - 2] + gathered[u - 1] + gathered[u] + std::max(transient[u - 2], transient[u]));
  }
  return most;
}

// FSDP's buffers: the units gathered at once under the plan's reshard policy, the recompute's gather, and on GPU
// the flat collectives' landing buffer and reduce-scatter inputs.
int64_t fsdp_bytes(const Walk& w, const RankShards& held) {
  const bool gpu = w.c.options.gpu;
  const std::vector<HeldUnit>& units = held.units;
  std::vector<int64_t> gathered, transient;
  int64_t largest_gathered = 0, largest_unit_numel = 0;
  for (const HeldUnit& u : units) {
    gathered.push_back(gathered_bytes(u, w.bytes));
    // CPU (one Gloo all-gather per parameter): the parameter being gathered also has a transient copy of its
    // whole size, so the last unit to arrive adds its largest parameter.
    transient.push_back(gpu ? 0 : u.largest_numel * w.bytes.reduced);
    largest_gathered = std::max(largest_gathered, gathered.back());
    largest_unit_numel = std::max(largest_unit_numel, u.trained_numel);  // what its reduce-scatter moves
  }
  int64_t bytes = 0;
  if (w.plan.data_parallel.options.reshard_after_forward == ReshardAfterForward::never) {
    // Never resharding after forward (the PP default) keeps every unit of the rank gathered.
    for (const int64_t g : gathered) bytes += g;
    bytes += transient.empty() ? 0 : *std::max_element(transient.begin(), transient.end());
  } else {
    bytes = chains_in_flight(units, gathered, transient);
    const bool two_chains = std::any_of(units.begin(), units.end(), [](const HeldUnit& u) { return u.experts; });
    if (!two_chains) bytes = std::max(bytes, shared_experts_in_flight(units, gathered, transient));
  }
  // The backward's recompute gathers the unit again while the next one is prefetched.
  if (!w.plan.activation_checkpoint.modules.empty()) bytes += w.max_block_unit;
  // GPU: flat collectives add the landing buffer of the unit being gathered and the flat reduce-scatter input of
  // the unit being reduced; FSDP2 frees a unit's input only in the next unit's post-backward, after waiting on
  // it: two are alive at once.
  if (gpu) bytes += largest_gathered + 2 * largest_unit_numel * w.bytes.reduced;
  return bytes;
}

}  // namespace

int64_t communication_bytes(const Walk& w, int64_t rank, const RankShards& held) {
  const dist::MeshShape& m = w.l.mesh;
  int64_t bytes = 0;
  if (w.fsdp) {
    bytes = fsdp_bytes(w, held);
  } else if (m.dp_replicate > 1 && w.c.options.gpu) {
    // DDP's flat all-reduce of the largest unit's gradients, in the reduce dtype.
    for (const HeldUnit& u : held.units) bytes = std::max(bytes, u.trained_numel * w.bytes.reduced);
  }
  if (m.pp > 1) {
    // torch.distributed.pipelining allocates at setup, and keeps, a receive buffer for every microbatch of every
    // local stage: its input (but on the first stage) and its output's gradient (but on the last).
    const auto num_stages = static_cast<int64_t>(w.stages.modules.size());
    for (const int64_t s : w.stages.of_rank[static_cast<size_t>(rank)]) {
      const int64_t buffers = (s > 0 ? 1 : 0) + (s + 1 < num_stages ? 1 : 0);
      bytes += buffers * w.stages.microbatches * w.boundary;
    }
  }
  return bytes;
}

void add_unit_traffic(const Walk& w, const RankShards& held, RankPlan* out) {
  out->units = 0;
  for (const HeldUnit& u : held.units) {
    // EP's experts go over efsdp, the rest over dp_shard x cp.
    (u.experts ? out->expert_gathered : out->gathered) += gathered_bytes(u, w.bytes);
    (u.experts ? out->expert_reduced : out->reduced) += u.trained_numel * w.bytes.reduced;
    ++out->units;
  }
  out->units = std::max<int64_t>(out->units, 1);
}

}  // namespace titan::planner::detail
