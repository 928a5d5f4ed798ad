// SPDX-License-Identifier: BSD-3-Clause
// The search over layouts: every mesh of a number of GPUs that the job's checks and parallel::plan accept, every
// batch split and AC mode, planned (the plans applied once per what places the parameters: PlannerState's
// cache) and ranked by predicted tokens/s.
#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "memory_plan_detail.hpp"
#include "titan/core/error.hpp"

namespace titan::planner {
namespace {

// The choices a search keeps at the config's values (SearchOptions::hold).
struct Held {
  bool dp_shard = false, tp = false, pp = false, cp = false, ep = false, ac = false, microbatch = false;
};

Held held_choices(const std::vector<std::string>& names, const ParallelismConfig& par) {
  Held h;
  for (const std::string& name : names) {
    bool* flag = name == "dp_shard"     ? &h.dp_shard
                 : name == "tp"         ? &h.tp
                 : name == "pp"         ? &h.pp
                 : name == "cp"         ? &h.cp
                 : name == "ep"         ? &h.ep
                 : name == "ac"         ? &h.ac
                 : name == "microbatch" ? &h.microbatch
                                        : nullptr;
    TITAN_CHECK_VALUE(flag != nullptr,
                      "[titan::planner::search_layouts] expected --hold to name dp_shard, tp, pp, cp, ep, ac or "
                      "microbatch, got '{}'.",
                      name);
    *flag = true;
  }
  TITAN_CHECK_VALUE(!h.dp_shard || par.data_parallel_shard_degree > 0,
                    "[titan::planner::search_layouts] expected parallelism.data_parallel_shard_degree > 0 to hold "
                    "dp_shard, got {} (fill the rest). Set the degree or search it.",
                    par.data_parallel_shard_degree);
  return h;
}

// The AC settings tried: none, selective every 2nd block, per op, full; or the config's when held.
std::vector<ActivationCheckpointConfig> ac_choices(const JobConfig& config, const Held& held) {
  if (held.ac) return {config.activation_checkpoint};
  std::vector<ActivationCheckpointConfig> out;
  for (const std::string_view option : {"", "2", "op", "full"}) {
    ActivationCheckpointConfig ac = config.activation_checkpoint;
    ac.mode = option.empty() ? AcMode::none : option == "full" ? AcMode::full : AcMode::selective;
    if (ac.mode == AcMode::selective) ac.selective_ac_option = std::string(option);
    out.push_back(ac);
  }
  return out;
}

// Every mesh of `gpus` devices tried (tp 1-8, cp 1-8, pp up to half the blocks, dp_shard what they leave, every
// ep dividing dp_shard x cp) that the job's checks accept; parallel::plan refuses the rest when it is asked.
std::vector<dist::MeshShape> candidate_meshes(const models::Decoder& model, const JobConfig& config, const Held& held,
                                              int64_t gpus, int64_t global) {
  const ParallelismConfig& par = config.parallelism;
  std::vector<dist::MeshShape> out;
  for (int64_t tp = 1; tp <= 8 && tp <= gpus; tp *= 2) {
    for (int64_t cp = 1; cp <= 8 && tp * cp <= gpus; cp *= 2) {
      for (int64_t pp = 1; tp * cp * pp <= gpus && pp <= std::max<int64_t>(model.shape().n_layers / 2, 1); pp *= 2) {
        const int64_t dp = gpus / (tp * cp * pp);
        if (gpus % (tp * cp * pp) != 0 || global % dp != 0) continue;
        if ((held.tp && tp != par.tensor_parallel_degree) || (held.cp && cp != par.context_parallel_degree) ||
            (held.pp && pp != par.pipeline_parallel_degree) || (held.dp_shard && dp != par.data_parallel_shard_degree))
          continue;
        for (int64_t ep = 1; ep <= dp * cp; ep *= 2) {
          if ((dp * cp) % ep != 0 || (held.ep && ep != par.expert_parallel_degree)) continue;
          // ETP, when the config asks for it, is tp itself.
          const int64_t etp = par.expert_tensor_parallel_degree > 1 ? tp : 1;
          const dist::MeshShape mesh{
              .pp = pp, .dp_replicate = 1, .dp_shard = dp, .cp = cp, .tp = tp, .ep = ep, .etp = etp};
          try {
            detail::check_layout(model, config, mesh);
          } catch (const c10::Error&) {
            continue;  // a degree the model or the sequence cannot take
          }
          out.push_back(mesh);
        }
      }
    }
  }
  return out;
}

// The batch splits tried on `mesh`: every power-of-two microbatch of the sequences a dp rank takes per step (under
// PP at least pp microbatches a step; else gradient accumulation takes the rest).
std::vector<detail::Layout> batch_layouts(const dist::MeshShape& mesh, const JobConfig& config, const Held& held,
                                          int64_t global) {
  const ParallelismConfig& par = config.parallelism;
  const int64_t per_rank = global / mesh.dp();  // sequences per dp rank per step
  std::vector<detail::Layout> out;
  for (int64_t mb = 1; mb <= per_rank; mb *= 2) {
    if (per_rank % mb != 0) continue;
    if (held.microbatch &&
        mb != (mesh.pp > 1 ? par.pipeline_parallel_microbatch_size : config.training.local_batch_size))
      continue;
    detail::Layout l{.mesh = mesh, .microbatch = mb};
    if (mesh.pp > 1) {
      if (per_rank / mb < mesh.pp) continue;  // the schedule needs pp microbatches
      l.local_batch = per_rank;
    } else {
      l.local_batch = mb;
      l.accumulation = per_rank / mb;
    }
    out.push_back(l);
  }
  return out;
}

}  // namespace

std::vector<MemoryPlan> MemoryPlanner::search(const JobConfig& config, const PlanOptions& options,
                                              const SearchOptions& what) {
  TITAN_CHECK_VALUE(what.gpus >= 1, "[titan::planner::search_layouts] expected --gpus N >= 1, got {}.", what.gpus);
  TITAN_CHECK_VALUE(options.device_memory > 0,
                    "[titan::planner::search_layouts] expected a device memory, got none. Pass --device-memory 80GB "
                    "or a GPU name (H100).");
  detail::check_options(options, what.gpus, "search_layouts");
  const detail::Context c = detail::make_context(*state_, config, options);
  const Held held = held_choices(what.hold, config.parallelism);
  // The global batch stays the config's: its global_batch_size, or local_batch_size x the data-parallel
  // degree the config's own layout has on this many GPUs.
  int64_t global = config.training.global_batch_size;
  if (global <= 0) {
    const ParallelismConfig& p = config.parallelism;
    const int64_t others = p.pipeline_parallel_degree * p.context_parallel_degree * p.tensor_parallel_degree;
    global = config.training.local_batch_size * std::max<int64_t>(what.gpus / std::max<int64_t>(others, 1), 1);
  }
  const std::vector<ActivationCheckpointConfig> acs = ac_choices(config, held);
  std::vector<MemoryPlan> fits;
  for (const dist::MeshShape& mesh : candidate_meshes(model(), config, held, what.gpus, global)) {
    for (detail::Layout l : batch_layouts(mesh, config, held, global)) {
      for (const ActivationCheckpointConfig& ac : acs) {
        l.ac = ac;
        try {
          MemoryPlan plan = detail::evaluate(c, l);
          if (plan.fits()) fits.push_back(std::move(plan));
        } catch (const c10::Error&) {
          continue;  // what parallel::plan or parallelize refuse (a split with more stages than blocks, ...)
        }
      }
    }
  }
  // Fastest first; among equal speeds the one with more memory left at its reserved peak.
  std::sort(fits.begin(), fits.end(), [&](const MemoryPlan& a, const MemoryPlan& b) {
    if (a.tokens_per_second != b.tokens_per_second) return a.tokens_per_second > b.tokens_per_second;
    return a.headroom() > b.headroom();
  });
  if (static_cast<int64_t>(fits.size()) > what.limit) fits.resize(static_cast<size_t>(what.limit));
  return fits;
}

}  // namespace titan::planner
