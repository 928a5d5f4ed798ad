// SPDX-License-Identifier: BSD-3-Clause
// One layout's plan. Parameters, gradients and optimizer state are exact byte counts of the tensors
// titan keeps (TP shards, then FSDP's dim-0 shards padded to equal rows; under EP each rank's routed
// experts whole); activations add up each block's terms (memory_plan_activations.cpp) over one
// microbatch's forward and backward to find its peak, and over the pipeline schedule's program for the
// microbatches in flight; communication is the gathered FSDP units in flight. On GPU the terms that
// make it predict torchtitan's published runs follow (allocator, NCCL, float8, compile, loss
// parallelism, pipelining buffers); the step time is memory_plan_time.cpp's.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "memory_plan_detail.hpp"
#include "titan/core/error.hpp"
#include "titan/models/decoder_spec.hpp"
#include "titan/parallel/pipeline_schedule.hpp"
#include "titan/parallel/planner.hpp"

namespace titan::models::detail {
namespace {

// The terms below make the plan predict torchtitan's published H100 runs (benchmarks/
// llama3_h100_202412_torchtitan.md); docs/memory_planner.md compares every row. These are argued from
// what CUDA and NCCL allocate; the two fitted fractions are memory_plan_calibration.hpp's.

// A process's CUDA context, kernel images and libraries (cuBLAS, NCCL): about 600 MiB on an H100 with
// torch loaded, outside the allocator.
constexpr int64_t kCudaContext = 600 * kMiB;
// NCCL's own buffers per communicator, cudaMalloc'd by NCCL and so outside the allocator too: per
// channel a 4 MiB Simple, ~4.5 MiB LL128 and 256 KiB LL buffer for each of the ring's two peers, with
// 32 channels on NVLink.
constexpr int64_t kNcclPerCommunicator = 32 * 2 * (8 * kMiB + kMiB * 3 / 4);

// The top-level module of a path: "layers.3" of "layers.3.moe.experts", "norm" of "norm".
std::string top_level(const std::string& path) {
  const size_t dot = path.find('.');
  if (dot == std::string::npos) return path;
  if (path.compare(0, dot, "layers") != 0) return path.substr(0, dot);
  return path.substr(0, path.find('.', dot + 1));
}

struct RankModules {
  std::set<std::string> modules;
  std::vector<int64_t> stages;  // global stage indices on this rank
};

// Microbatches each stage holds at the worst moment of rank's program, weighted by bytes per stage:
// walks the program, +1 at a forward, -1 at the backward that frees the activations (B, or W for
// split backward since W still reads saved inputs).
double max_in_flight_bytes(const parallel::PipelineProgram& program, int64_t rank,
                           const std::map<int64_t, int64_t>& stage_bytes, int64_t* count) {
  using Op = parallel::PipelineAction::Op;
  bool split = false;
  for (const auto& a : program.actions[static_cast<size_t>(rank)]) split |= a.op == Op::kBackwardWeight;
  std::map<int64_t, int64_t> live;
  double best = 0;
  int64_t best_count = 0;
  for (const auto& a : program.actions[static_cast<size_t>(rank)]) {
    if (a.op == Op::kForward) ++live[a.stage];
    if ((a.op == Op::kBackward) || (split && a.op == Op::kBackwardWeight)) --live[a.stage];
    double bytes = 0;
    int64_t n = 0;
    for (const auto& [stage, k] : live) {
      bytes += static_cast<double>(k) * static_cast<double>(stage_bytes.at(stage));
      n += k;
    }
    if (bytes > best) {
      best = bytes;
      best_count = n;
    }
  }
  *count = best_count;
  return best;
}

}  // namespace

MemoryPlan evaluate(const Context& c, const Layout& l) {
  const JobConfig& cfg = c.config;
  const DecoderShape& shape = c.model.shape();
  const dist::MeshShape& m = l.mesh;
  const bool gpu = c.options.gpu;
  const int64_t shard_n = m.dp_shard * m.cp;  // FSDP shards over dp_shard x cp
  const bool fsdp = shard_n > 1;
  const bool data_parallel = fsdp || m.dp_replicate > 1;
  const int64_t p_bytes = elem_bytes(cfg.training.dtype);
  const int64_t g_bytes =
      gpu && data_parallel ? elem_bytes(mixed_precision_param(cfg.training, /*cuda=*/true)) : p_bytes;
  const int64_t r_bytes = gpu && data_parallel ? elem_bytes(cfg.training.mixed_precision_reduce) : p_bytes;
  const int64_t state_bytes =
      cfg.optimizer.implementation == OptimizerImplementation::fused_opt_states_bf16 ? 2 : p_bytes;
  const int64_t compute_bytes =
      gpu ? (cfg.training.dtype != DType::float32 ? p_bytes
                                                  : elem_bytes(mixed_precision_param(cfg.training, /*cuda=*/true)))
          : p_bytes;

  const bool compiled = cfg.compile.enable && std::find(cfg.compile.components.begin(), cfg.compile.components.end(),
                                                        "model") != cfg.compile.components.end();
  const bool float8 = gpu && std::any_of(cfg.model.converters.begin(), cfg.model.converters.end(),
                                         [](const std::string& n) { return is_float8_converter(n); });
  // FSDP all-gathers float8 linear weights (1 byte) with enable_fsdp_float8_all_gather, except the
  // filtered ones (the output projection), which stay in the param dtype.
  const bool fp8_gather = float8 && cfg.float8.enable_fsdp_float8_all_gather;
  auto float8_weight = [&](const ParamShape& p) {
    if (!fp8_gather || p.row_numel <= 1 || p.module == "tok_embeddings") return false;
    return std::none_of(cfg.float8.filter_fqns.begin(), cfg.float8.filter_fqns.end(),
                        [&](const std::string& fqn) { return p.name.find(fqn) != std::string::npos; });
  };

  MemoryPlan plan{.mesh = m,
                  .ac = l.ac.name,
                  .microbatch = l.microbatch,
                  .local_batch = l.local_batch,
                  .global_batch = l.local_batch * l.accumulation * m.dp(),
                  .device_memory = c.options.device_memory};
  Shapes x;
  x.b = l.microbatch;
  x.s = cfg.training.seq_len / m.cp;
  x.tp = m.tp;
  x.cp = m.cp;
  x.bytes = compute_bytes;
  x.fused_norm = gpu;
  x.ep = m.ep;
  x.etp = m.etp;
  // EP's experts without efsdp keep their param dtype and are cast for the grouped GEMM; over efsdp the
  // gather lands in the compute dtype (counted with FSDP's buffers).
  x.expert_copy = gpu && g_bytes != p_bytes && (m.ep == 1 || m.efsdp() == 1) ? g_bytes : 0;
  x.fused_loss = !gpu && m.tp == 1;
  x.compiled = gpu && compiled;
  x.loss_parallel = gpu && m.tp > 1 && !cfg.parallelism.disable_loss_parallel;
  x.D = shape.dim;
  x.V = shape.vocab_size / m.tp;
  // Every block's terms (the model's own modules: dense or MoE, its attention).
  std::vector<BlockTerms> terms(static_cast<size_t>(shape.n_layers));
  for (const auto& block : c.model.layers)
    terms[static_cast<size_t>(block->layer_id)] = block_terms(*block, c.attention, x);

  // Which modules each pp rank holds.
  const auto stages = m.pp > 1
                          ? parallel::pipeline_plan(decoder_sharding_spec(shape).pipeline,
                                                    cfg.parallelism.pipeline_parallel_split == PipelineSplitBy::flops
                                                        ? pipeline_costs(c.model, cfg.training.seq_len)
                                                        : parallel::PipelineModuleCosts{},
                                                    m.pp, cfg.parallelism, shape.where)
                                .stages
                          : std::vector<std::vector<std::string>>{};
  std::vector<RankModules> ranks(static_cast<size_t>(m.pp));
  parallel::PipelineProgram program;
  const int64_t pp_microbatches = m.pp > 1 ? l.local_batch / l.microbatch : 1;
  if (m.pp == 1) {
    for (const auto& p : c.params) ranks[0].modules.insert(p.module);
    ranks[0].stages = {0};
  } else {
    const PipelineSchedule schedule = cfg.parallelism.pipeline_parallel_schedule;
    program = parallel::make_pipeline_program(schedule, m.pp, static_cast<int64_t>(stages.size()), pp_microbatches);
    for (size_t s = 0; s < stages.size(); ++s) {
      RankModules& r = ranks[static_cast<size_t>(program.stage_rank[s])];
      r.stages.push_back(static_cast<int64_t>(s));
      for (const auto& path : stages[s]) r.modules.insert(path);
    }
  }

  // Per stage: activation bytes one microbatch keeps, and the peak of one microbatch's fwd+bwd.
  auto stage_modules = [&](int64_t s) -> std::vector<std::string> {
    if (m.pp == 1) {
      std::vector<std::string> all{"tok_embeddings"};
      for (int64_t i = 0; i < shape.n_layers; ++i) all.push_back("layers." + std::to_string(i));
      all.push_back("norm");
      all.push_back("output");
      return all;
    }
    return stages[static_cast<size_t>(s)];
  };
  std::vector<int64_t> unit_grad(c.units.size(), 0);  // unsharded gradient bytes of each unit (FSDP)
  int64_t max_block_unit = 0;                         // gathered bytes of a block's unit
  std::vector<int64_t> unit_gathered(c.units.size(), 0);
  std::vector<int64_t> unit_largest(c.units.size(), 0);  // gathered bytes of each unit's largest weight
  std::map<int64_t, std::vector<size_t>> block_units;    // layer -> its units (an MoE block has two)
  for (size_t u = 0; u < c.units.size(); ++u) {
    const int64_t layer = ModelParts::layer_index(top_level(c.units[u][0]));
    if (layer >= 0) block_units[layer].push_back(u);
  }
  for (const auto& p : c.params) {
    // Under EP a routed expert's weight is this rank's E/ep experts, which a unit of its own splits again
    // over efsdp and gathers per layer; with efsdp 1 nothing gathers them.
    const bool ep_expert = p.expert && m.ep > 1;
    if (ep_expert && m.efsdp() == 1) continue;
    const int64_t numel =
        (ep_expert ? p.rows / m.ep : p.rows) * p.row_numel / (p.tp_dim >= 0 ? m.tp : 1) / (p.expert ? m.etp : 1);
    const auto u = static_cast<size_t>(p.unit);
    unit_gathered[u] += numel * (float8_weight(p) ? 1 : g_bytes);
    unit_grad[u] += numel * g_bytes;
    unit_largest[u] = std::max(unit_largest[u], numel * r_bytes);
  }
  for (const auto& [layer, units] : block_units) {
    for (size_t u : units) max_block_unit = std::max(max_block_unit, unit_gathered[u]);
  }
  struct StageActivations {
    int64_t saved = 0;
    int64_t peak = 0;
  };
  auto stage_activations = [&](int64_t s) {
    int64_t live = 0;
    int64_t peak = 0;
    int64_t saved = 0;
    std::vector<std::pair<int64_t, BlockAc>> blocks;
    bool head = false;
    for (const auto& path : stage_modules(s)) {
      if (path.starts_with("layers."))
        blocks.emplace_back(std::stoll(path.substr(7)), l.ac.block(std::stoll(path.substr(7))));
      if (path == "output" || (path == "norm" && shape.tied)) head = true;
    }
    for (const auto& [layer, ac] : blocks) {
      const BlockTerms& b = terms[static_cast<size_t>(layer)];
      const int64_t keep = b.block_activations(ac);
      peak = std::max(peak, live + (ac == BlockAc::none ? keep : b.full) + b.forward);
      live += keep;
    }
    const int64_t head_keep = head ? head_saved(x) : 0;
    if (head) {
      live += head_keep;
      peak = std::max(peak, live + loss_transient(x));
      live -= head_keep;
    }
    saved = live + head_keep;
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      const BlockTerms& b = terms[static_cast<size_t>(it->first)];
      const int64_t keep = b.block_activations(it->second);
      const int64_t recompute = it->second == BlockAc::none ? 0 : b.full - keep;
      int64_t unit = 0;  // the block's unsharded gradients before their reduce-scatter
      if (fsdp) {
        for (size_t u : block_units[it->first]) unit += unit_grad[u];
      }
      peak = std::max(peak, live + recompute + b.backward + unit);
      live -= keep;
    }
    return StageActivations{.saved = saved, .peak = peak};
  };

  // Under PP a stage's output and the gradient sent back for it are one (sequence-parallel) block output.
  const int64_t boundary = x.Tn() * x.D * x.bytes;
  const int64_t num_stages = m.pp > 1 ? static_cast<int64_t>(stages.size()) : 1;
  MemoryParts worst;
  int64_t worst_gathered = 0;  // the shown rank's FSDP-gathered bytes (one all-gather of all its units)
  int64_t worst_reduced = 0;   // and the bytes its reduce-scatters take in
  int64_t worst_units = 1;
  int64_t worst_experts = 0;                                    // and its EP-sharded expert elements
  int64_t worst_expert_gathered = 0, worst_expert_reduced = 0;  // of those bytes, EP's experts over efsdp
  for (int64_t r = 0; r < m.pp; ++r) {
    const RankModules& rank = ranks[static_cast<size_t>(r)];
    MemoryParts parts;
    int64_t tensors = 0;
    int64_t elements = 0;   // the rank's parameter elements (FSDP shards padded)
    int64_t unsharded = 0;  // local (TP) numel of the rank's parameters
    int64_t experts = 0;    // elements of the rank's EP-sharded experts
    for (const auto& p : c.params) {
      if (!rank.modules.contains(p.module)) continue;
      const int64_t rows = p.tp_dim == 0 ? p.rows / m.tp : p.rows;
      // ETP splits a routed expert's hidden dim (w1/w3's dim 1, w2's dim 2): within a row.
      const int64_t row_numel = p.tp_dim == 1 ? p.row_numel / m.tp : p.expert ? p.row_numel / m.etp : p.row_numel;
      // FSDP pads to equal rows; under EP a routed expert's weight holds this rank's E/ep experts split
      // again over efsdp (torchtitan's efsdp mesh; replicated over dp_replicate, which all-reduces them).
      const bool ep_shard = p.expert && m.ep > 1;
      const int64_t local_rows = ep_shard ? ceil_div(rows / m.ep, m.efsdp()) : fsdp ? ceil_div(rows, shard_n) : rows;
      if (ep_shard) experts += local_rows * row_numel;
      elements += local_rows * row_numel;
      parts.parameters += local_rows * row_numel * p_bytes;
      unsharded += rows * row_numel;
      ++tensors;
    }
    parts.gradients = parts.parameters;
    // Under PP the microbatches' gradients accumulate unsharded until the step's last backward.
    if (m.pp > 1 && data_parallel) parts.gradients += unsharded * r_bytes;
    // exp_avg, exp_avg_sq like the shard (bf16 under fused_opt_states_bf16); an fp32 step per tensor.
    parts.optimizer = 2 * elements * state_bytes + 4 * tensors;
    // FSDP: the unit in use and the one prefetched are gathered (the last two of the forward are kept
    // for backward); never resharding after forward (the PP default) keeps every unit of the rank.
    std::vector<int64_t> gathered;
    for (size_t u = 0; u < c.units.size(); ++u) {
      const bool on_rank = std::any_of(c.units[u].begin(), c.units[u].end(),
                                       [&](const std::string& path) { return rank.modules.contains(top_level(path)); });
      gathered.push_back(on_rank ? unit_gathered[u] : 0);
    }
    if (fsdp) {
      ReshardAfterForward policy = cfg.parallelism.fsdp_reshard_after_forward;
      if (m.pp > 1 && policy == ReshardAfterForward::default_) policy = ReshardAfterForward::never;
      // CPU (one Gloo all-gather per parameter): the parameter being gathered also has a transient copy
      // of its whole size, so the last unit to arrive adds its largest parameter.
      auto largest = [&](size_t u) { return gpu || gathered[u] == 0 ? 0 : unit_largest[u]; };
      if (policy == ReshardAfterForward::never) {
        int64_t biggest = 0;
        for (size_t u = 0; u < gathered.size(); ++u) {
          parts.communication += gathered[u];
          biggest = std::max(biggest, largest(u));
        }
        parts.communication += biggest;
      } else {
        // With EP over efsdp the experts are an FSDP of their own that prefetches along its own chain of
        // units: its pair is gathered beside the dense pair.
        const bool two_chains = m.ep > 1 && m.efsdp() > 1;
        std::vector<bool> expert_unit(gathered.size(), false);
        for (size_t u = 0; two_chains && u < gathered.size(); ++u)
          expert_unit[u] = c.units[u][0].ends_with(".moe.experts");
        // Each chain holds the unit in use and the one it prefetches (in forward the next, in backward
        // the previous); walking the units in both directions finds the moment both chains hold most.
        const auto n = static_cast<int64_t>(gathered.size());
        auto on_chain = [&](int64_t u, bool expert_chain) {
          return gathered[static_cast<size_t>(u)] != 0 && expert_unit[static_cast<size_t>(u)] == expert_chain;
        };
        for (const int64_t step : {int64_t{1}, int64_t{-1}}) {
          for (int64_t i = 0; i < n; ++i) {
            int64_t held = 0, transient = 0;
            for (const bool expert_chain : {false, true}) {
              int64_t cur = i;  // the chain's unit in use at i: the last one reached
              while (cur >= 0 && cur < n && !on_chain(cur, expert_chain)) cur -= step;
              if (cur < 0 || cur >= n) continue;
              int64_t next = cur + step;  // and the one it prefetches
              while (next >= 0 && next < n && !on_chain(next, expert_chain)) next += step;
              for (const int64_t u : {cur, next}) {
                if (u < 0 || u >= n) continue;
                held += gathered[static_cast<size_t>(u)];
                transient = std::max(transient, largest(static_cast<size_t>(u)));
              }
            }
            parts.communication = std::max(parts.communication, held + transient);
          }
        }
        // An MoE block whose shared experts run after the routed ones: its backward starts in the dense
        // unit (the shared experts), which prefetches the unit before it (the previous block's experts),
        // and then gathers its own routed experts: three units at once.
        for (size_t u = 2; !two_chains && u < gathered.size(); ++u) {
          const auto& paths = c.units[u - 1];
          const bool shared = std::any_of(paths.begin(), paths.end(),
                                          [](const std::string& p) { return p.ends_with(".moe.shared_experts"); });
          if (shared && c.units[u][0].ends_with(".moe.experts"))
            parts.communication = std::max(parts.communication, gathered[u - 2] + gathered[u - 1] + gathered[u] +
                                                                    std::max(largest(u - 2), largest(u)));
        }
      }
      // The backward's recompute gathers the unit again while the next one is prefetched.
      if (l.ac.mode != AcMode::none) parts.communication += max_block_unit;
      // GPU: flat collectives add the landing buffer of the unit being gathered and the flat
      // reduce-scatter input of the unit being reduced.
      if (gpu) {
        const int64_t largest = *std::max_element(gathered.begin(), gathered.end());
        int64_t largest_grad = 0;  // unsharded gradient bytes (param dtype) of the rank's largest unit
        for (size_t u = 0; u < gathered.size(); ++u) {
          if (gathered[u] > 0) largest_grad = std::max(largest_grad, unit_grad[u]);
        }
        // FSDP2 frees a unit's reduce-scatter input only in the next unit's post-backward, after waiting
        // on it: two are alive at once.
        parts.communication += largest + 2 * (largest_grad / std::max<int64_t>(g_bytes, 1) * r_bytes);
      }
    } else if (m.dp_replicate > 1 && gpu) {
      parts.communication = *std::max_element(gathered.begin(), gathered.end()) / g_bytes * r_bytes;
    }
    // Activations: one microbatch's peak, plus the other microbatches the schedule keeps in flight.
    std::map<int64_t, int64_t> stage_saved;
    int64_t one_peak = 0;
    int64_t one_saved = 0;
    for (int64_t s : rank.stages) {
      const StageActivations a = stage_activations(s);
      // The pipeline keeps each microbatch's stage output until its backward (autograd's root).
      stage_saved[s] = a.saved + (m.pp > 1 && s + 1 < num_stages ? boundary : 0);
      if (a.peak - a.saved > one_peak - one_saved) {
        one_peak = a.peak;
        one_saved = a.saved;
      }
    }
    int64_t in_flight = 1;
    int64_t per_mb = one_saved;
    if (m.pp > 1) {
      const double held = max_in_flight_bytes(program, r, stage_saved, &in_flight);
      parts.activations = static_cast<int64_t>(held) - one_saved + one_peak;
      per_mb = 0;
      for (const auto& [s, bytes] : stage_saved) per_mb += bytes;
    } else {
      parts.activations = one_peak;
    }
    if (m.pp > 1) {
      // torch.distributed.pipelining allocates at setup, and keeps, a receive buffer for every
      // microbatch of every local stage: its input (but on the first stage) and its output's gradient
      // (but on the last).
      for (int64_t s : rank.stages) {
        const int64_t buffers = (s > 0 ? 1 : 0) + (s + 1 < num_stages ? 1 : 0);
        parts.communication += buffers * pp_microbatches * boundary;
      }
    }
    if (r == 0 || parts.total() > worst.total()) {
      worst = parts;
      worst_gathered = 0;
      worst_reduced = 0;
      worst_units = 0;
      worst_expert_gathered = 0;
      worst_expert_reduced = 0;
      for (size_t u = 0; u < gathered.size(); ++u) {
        if (gathered[u] == 0) continue;
        const int64_t reduced = unit_grad[u] / std::max<int64_t>(g_bytes, 1) * r_bytes;
        // EP's experts go over efsdp, the rest over dp_shard x cp.
        const bool experts_unit = m.ep > 1 && c.units[u][0].ends_with(".moe.experts");
        (experts_unit ? worst_expert_gathered : worst_gathered) += gathered[u];
        (experts_unit ? worst_expert_reduced : worst_reduced) += reduced;
        ++worst_units;
      }
      worst_units = std::max<int64_t>(worst_units, 1);
      plan.pp_rank = r;
      plan.in_flight = in_flight;
      plan.activations_per_microbatch = per_mb;
      worst_experts = experts;
      plan.expert_dispatch = 0;
      for (const std::string& path : rank.modules) {
        const int64_t layer = ModelParts::layer_index(path);
        if (layer >= 0)
          plan.expert_dispatch = std::max(plan.expert_dispatch, terms[static_cast<size_t>(layer)].dispatch);
      }
    }
  }
  plan.parts = worst;
  plan.microbatches = m.pp > 1 ? pp_microbatches * l.accumulation : l.accumulation;

  // The caching allocator's reserved peak and what lives outside it (see the constants above).
  // What lives across steps: parameters, their sharded gradients and the optimizer state. Everything
  // else is allocated and freed within a step, PP's unsharded gradient accumulators included (made in
  // the first microbatch's backward, freed after the step's reduce-scatter).
  const int64_t states = 2 * worst.parameters + worst.optimizer;
  const int64_t transient = worst.total() - states;
  if (gpu) {
    // One communicator per process group the step uses: FSDP's shard group, HSDP's replicate group,
    // TP, CP, PP's two neighbours (a send/recv pair gets its own) and the loss and grad-norm reductions.
    int64_t communicators = m.world_size() > 1 ? 1 : 0;
    communicators += (fsdp ? 1 : 0) + (m.dp_replicate > 1 ? 1 : 0) + (m.tp > 1 ? 1 : 0) + (m.cp > 1 ? 1 : 0);
    communicators += m.pp > 1 ? 2 : 0;
    communicators += (m.ep > 1 ? 1 : 0) + (m.ep > 1 && m.efsdp() > 1 ? 1 : 0);  // EP's all-to-alls, efsdp's reduce
    plan.outside_allocator = kCudaContext + communicators * kNcclPerCommunicator;
    // The published memory is torch.cuda.memory_stats' reserved_bytes.all.peak: the segments the caching
    // allocator took from cudaMalloc, not the live tensors. The states are allocated once, each in a block
    // of its own size (rounded to 2 MiB: under 0.1% here). The transient tensors are freed and allocated
    // again in other sizes every microbatch; the allocator splits cached blocks for smaller requests and
    // keeps them, so its segments outgrow the live bytes by a fitted fraction. Without PP a backward frees
    // what its forward allocated in reverse order; under PP a microbatch's backward frees its activations
    // while later microbatches' stay allocated above them, which leaves holes: a fraction of its own.
    const double fragmentation =
        m.pp > 1 ? c.calibration.pipeline_fragmentation : c.calibration.transient_fragmentation;
    plan.reserved = states + static_cast<int64_t>(static_cast<double>(transient) * (1 + fragmentation));
  } else {
    plan.reserved = worst.total();  // CPU: the tracker counts tensors; no caching allocator
  }

  // Speed: model FLOPs per device at the compute efficiency, plus what the layout cannot hide.
  const StepInputs step{.x = x,
                        .terms = terms,
                        .modules = ranks[static_cast<size_t>(plan.pp_rank)].modules,
                        .program = program,
                        .stages_per_rank = static_cast<int64_t>(ranks[0].stages.size()),
                        .num_stages = num_stages,
                        .pp_microbatches = pp_microbatches,
                        .boundary = boundary,
                        .gathered = worst_gathered,
                        .reduced = worst_reduced,
                        .expert_gathered = worst_expert_gathered,
                        .expert_reduced = worst_expert_reduced,
                        .units = worst_units,
                        .experts = worst_experts,
                        .r_bytes = r_bytes,
                        .compiled = compiled,
                        .float8 = float8};
  add_step_time(c, l, step, &plan);
  return plan;
}

}  // namespace titan::models::detail
