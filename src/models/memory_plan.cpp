// SPDX-License-Identifier: BSD-3-Clause
// The planner's entry points: the model's parameters as the layout shards them, the checks that name
// the key to change, one plan (plan_memory) and the search over layouts (search_layouts). The
// arithmetic of one layout is in memory_plan_evaluate.cpp.
#include "titan/models/memory_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "memory_plan_detail.hpp"
#include "titan/core/error.hpp"
#include "titan/models/decoder_spec.hpp"
#include "titan/models/job_args.hpp"
#include "titan/models/model_spec.hpp"
#include "titan/parallel/planner.hpp"

namespace titan::models {
namespace detail {
namespace {

// TP splits a head projection (and its bias) on dim 0, wo on dim 1, a dense feed-forward's w1/w3 on dim
// 0 and w2 on dim 1, the embedding and the output on dim 0 (models::decoder_sharding_spec); the
// replicated attention modules, the norms and the whole MoE (its experts replicated) stay whole.
int tp_dim_of(const std::string& name, const DecoderShape& shape) {
  if (name == "tok_embeddings.weight" || name == "output.weight") return 0;
  for (const std::string& w : shape.head_projections) {
    if (name.ends_with(".attention." + w + ".weight") || name.ends_with(".attention." + w + ".bias")) return 0;
  }
  if (name.ends_with(".attention.wo.weight")) return 1;
  if (name.ends_with(".feed_forward.w1.weight") || name.ends_with(".feed_forward.w3.weight")) return 0;
  if (name.ends_with(".feed_forward.w2.weight")) return 1;
  return -1;
}

std::vector<ParamShape> param_shapes(const Decoder& model, const std::vector<std::vector<std::string>>& units) {
  const DecoderShape& shape = model.shape();
  std::vector<ParamShape> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const at::Tensor& p = item.value();
    ParamShape s;
    s.name = name;
    const size_t dot = name.find('.');
    s.module = name.substr(0, dot);
    if (s.module == "layers") s.module = name.substr(0, name.find('.', dot + 1));
    s.rows = p.dim() > 0 ? p.size(0) : 1;
    s.row_numel = p.dim() > 0 ? p.numel() / std::max<int64_t>(p.size(0), 1) : 1;
    s.tp_dim = tp_dim_of(name, shape);
    s.expert = name.find(".moe.experts.") != std::string::npos;
    // Its unit: the one with the longest path that is a prefix of its name (layers.N.moe.experts before layers.N).
    size_t best = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      for (const std::string& path : units[u]) {
        if ((name == path || name.starts_with(path + ".")) && path.size() > best) {
          best = path.size();
          s.unit = static_cast<int64_t>(u);
        }
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

AcPolicy ac_policy(const ActivationCheckpointConfig& ac, const DecoderShape& shape) {
  // The plan's own parser checks the mode and option (the same errors the trainer gives).
  (void)parallel::activation_checkpoint_plan(decoder_sharding_spec(shape).blocks, ac, !shape.moe_layers.empty(),
                                             shape.where);
  AcPolicy p{.mode = ac.mode};
  if (ac.mode == AcMode::full) p.name = "full";
  if (ac.mode == AcMode::selective) {
    if (ac.selective_ac_option == "op") {
      p.op = true;
      p.name = "op";
    } else {
      p.every = std::stoll(ac.selective_ac_option);
      p.name = fmt::format("selective {}", p.every);
    }
  }
  return p;
}

Context make_context(const Decoder& model, const JobConfig& config, const PlanOptions& options,
                     const Calibration& calibration) {
  // The family's attention memory model, or nn::Attention's.
  AttentionMemoryModel attention = model_spec(config.model.name).attention_memory;
  if (!attention) attention = nn_attention_memory;
  auto units = model.sharding_spec().fsdp_units;
  auto params = param_shapes(model, units);
  return Context{.model = model,
                 .config = config,
                 .options = options,
                 .attention = std::move(attention),
                 .params = std::move(params),
                 .units = std::move(units),
                 .calibration = calibration};
}

}  // namespace detail

namespace {

using detail::AcPolicy;
using detail::Layout;

void check_layout(const Decoder& model, const JobConfig& cfg, const dist::MeshShape& m) {
  const DecoderShape& shape = model.shape();
  TITAN_CHECK_VALUE(shape.n_heads % m.tp == 0 && shape.n_kv_heads % m.tp == 0,
                    "[titan::models::plan_memory] expected n_heads ({}) and n_kv_heads ({}) divisible by "
                    "parallelism.tensor_parallel_degree, got {}. Choose a degree that divides both.",
                    shape.n_heads, shape.n_kv_heads, m.tp);
  // The trainer's own plan refuses what the family lacks (tied embeddings under TP).
  TITAN_CHECK_NOT_IMPLEMENTED(shape.tensor_parallel || m.tp == 1,
                              "[titan::models::plan_memory] expected tensor_parallel_degree 1 for {}, got {}: its "
                              "tensor parallelism is not built yet. Use data and expert parallelism.",
                              shape.where, m.tp);
  if (m.tp > 1)
    (void)parallel::tensor_parallel_plan(model.sharding_spec(), m.tp, /*sequence_parallel=*/true,
                                         /*loss_parallel=*/true);
  TITAN_CHECK_NOT_IMPLEMENTED(shape.pipeline_and_context_parallel || (m.pp == 1 && m.cp == 1),
                              "[titan::models::plan_memory] expected pipeline_parallel_degree and "
                              "context_parallel_degree 1 for {}, got pp {} and cp {}: its pipeline and context "
                              "parallelism are not built yet. Use data, tensor and expert parallelism.",
                              shape.where, m.pp, m.cp);
  if (m.ep > 1) {
    TITAN_CHECK_VALUE(shape.moe_num_experts > 0,
                      "[titan::models::plan_memory] expected parallelism.expert_parallel_degree = 1 for a dense "
                      "model ({}), got {}. Set it to 1.",
                      shape.where, m.ep);
    if (shape.moe_num_experts % m.ep != 0) {
      throw ConfigError("parallelism.expert_parallel_degree",
                        fmt::format("[titan::models::plan_memory] expected expert_parallel_degree to divide the "
                                    "{} experts, got {}. Choose a divisor of num_experts.",
                                    shape.moe_num_experts, m.ep));
    }
  }
  const int64_t divisor = m.cp * (m.cp > 1 ? 2 : 1) * m.tp;
  if (cfg.training.seq_len % divisor != 0) {
    throw ConfigError(
        "training.seq_len",
        fmt::format("[titan::models::plan_memory] expected training.seq_len divisible by {} "
                    "(context_parallel_degree {}{} x tensor_parallel_degree {}), got {}. Choose a "
                    "multiple of {}.",
                    divisor, m.cp, m.cp > 1 ? " x 2 (headtail)" : "", m.tp, cfg.training.seq_len, divisor));
  }
}

void check_options(const PlanOptions& o, int64_t world, const char* where) {
  TITAN_CHECK_VALUE(o.mfu >= 0 && o.mfu <= 1,
                    "[titan::models::{}] expected an MFU in (0, 1] (0: the calibrated default), got {}. Pass e.g. "
                    "--mfu 40%.",
                    where, o.mfu);
  TITAN_CHECK_VALUE(o.gpus_per_node >= 1, "[titan::models::{}] expected --gpus-per-node >= 1, got {}.", where,
                    o.gpus_per_node);
  TITAN_CHECK_VALUE(o.intra_node_bw > 0 && o.inter_node_bw > 0,
                    "[titan::models::{}] expected bandwidths > 0 bytes/s, got --intra-node-bw {} and "
                    "--inter-node-bw {}. Pass e.g. --intra-node-bw 450GB --inter-node-bw 50GB.",
                    where, o.intra_node_bw, o.inter_node_bw);
  // A job of several nodes fills each; one smaller than a node is a part of one.
  TITAN_CHECK_VALUE(!o.gpu || world <= o.gpus_per_node || world % o.gpus_per_node == 0,
                    "[titan::models::{}] expected --gpus to be a multiple of --gpus-per-node ({}) when it spans "
                    "nodes, got {}. Use whole nodes or set --gpus-per-node.",
                    where, o.gpus_per_node, world);
}

}  // namespace

MemoryPlan detail::plan_memory(const Decoder& model, const JobConfig& config, const PlanOptions& options,
                               const Calibration& calibration) {
  const ParallelismConfig& p = config.parallelism;
  int64_t world = options.world_size;
  if (world == 0) {
    world = p.pipeline_parallel_degree * p.data_parallel_replicate_degree * p.context_parallel_degree *
            p.tensor_parallel_degree * std::max<int64_t>(p.data_parallel_shard_degree, 1);
  }
  TITAN_CHECK_VALUE(world >= 1, "[titan::models::plan_memory] expected a world size >= 1, got {}. Pass --gpus N.",
                    world);
  check_options(options, world, "plan_memory");
  const dist::MeshShape mesh = dist::mesh_shape(p, world);
  check_layout(model, config, mesh);
  const detail::Context c = detail::make_context(model, config, options, calibration);
  Layout l{.mesh = mesh, .ac = detail::ac_policy(config.activation_checkpoint, model.shape())};
  const int64_t lbs = config.training.local_batch_size;
  const int64_t dp = mesh.dp();
  const int64_t global = config.training.global_batch_size > 0 ? config.training.global_batch_size : lbs * dp;
  if (global % (lbs * dp) != 0) {
    throw ConfigError("training.global_batch_size",
                      fmt::format("[titan::models::plan_memory] expected training.global_batch_size divisible by "
                                  "local_batch_size x data-parallel degree = {} x {}, got {}. Change one of them.",
                                  lbs, dp, global));
  }
  l.local_batch = lbs;
  l.accumulation = global / (lbs * dp);
  l.microbatch = lbs;
  if (mesh.pp > 1) {
    l.microbatch = p.pipeline_parallel_microbatch_size;
    if (l.microbatch < 1 || lbs % l.microbatch != 0) {
      throw ConfigError("parallelism.pipeline_parallel_microbatch_size",
                        fmt::format("[titan::models::plan_memory] expected pipeline_parallel_microbatch_size to "
                                    "divide training.local_batch_size ({}), got {}. Choose a divisor.",
                                    lbs, l.microbatch));
    }
  }
  return detail::evaluate(c, l);
}

MemoryPlan plan_memory(const Decoder& model, const JobConfig& config, const PlanOptions& options) {
  return detail::plan_memory(model, config, options, detail::Calibration{});
}

MemoryPlan plan_memory(const JobConfig& config, const PlanOptions& options) {
  const auto model = build_model(config, 0, {.device = at::kMeta});
  return plan_memory(*model, config, options);
}

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
                      "[titan::models::search_layouts] expected --hold to name dp_shard, tp, pp, cp, ep, ac or "
                      "microbatch, got '{}'.",
                      name);
    *flag = true;
  }
  TITAN_CHECK_VALUE(!h.dp_shard || par.data_parallel_shard_degree > 0,
                    "[titan::models::search_layouts] expected parallelism.data_parallel_shard_degree > 0 to hold "
                    "dp_shard, got {} (fill the rest). Set the degree or search it.",
                    par.data_parallel_shard_degree);
  return h;
}

}  // namespace

std::vector<MemoryPlan> search_layouts(const Decoder& model, const JobConfig& config, const PlanOptions& options,
                                       const SearchOptions& search) {
  TITAN_CHECK_VALUE(search.gpus >= 1, "[titan::models::search_layouts] expected --gpus N >= 1, got {}.", search.gpus);
  TITAN_CHECK_VALUE(options.device_memory > 0,
                    "[titan::models::search_layouts] expected a device memory, got none. Pass --device-memory 80GB "
                    "or a GPU name (H100).");
  check_options(options, search.gpus, "search_layouts");
  const DecoderShape& shape = model.shape();
  const detail::Context c = detail::make_context(model, config, options);
  // The global batch stays the config's: its global_batch_size, or local_batch_size x the data-parallel
  // degree the config's own layout has on this many GPUs.
  int64_t global = config.training.global_batch_size;
  if (global <= 0) {
    const ParallelismConfig& p = config.parallelism;
    const int64_t others = p.pipeline_parallel_degree * p.context_parallel_degree * p.tensor_parallel_degree;
    global = config.training.local_batch_size * std::max<int64_t>(search.gpus / std::max<int64_t>(others, 1), 1);
  }
  const ParallelismConfig& par = config.parallelism;
  const Held held = held_choices(search.hold, par);
  std::vector<AcPolicy> policies;
  if (held.ac) policies.push_back(detail::ac_policy(config.activation_checkpoint, shape));
  for (const char* option : {"", "2", "op", "full"}) {
    if (held.ac) break;
    ActivationCheckpointConfig ac = config.activation_checkpoint;
    ac.mode = std::string_view(option).empty()     ? AcMode::none
              : std::string_view(option) == "full" ? AcMode::full
                                                   : AcMode::selective;
    if (ac.mode == AcMode::selective) ac.selective_ac_option = option;
    policies.push_back(detail::ac_policy(ac, shape));
  }
  const bool split = shape.pipeline_and_context_parallel;  // else pp and cp stay 1
  std::vector<MemoryPlan> fits;
  for (int64_t tp = 1; tp <= 8 && tp <= search.gpus; tp *= 2) {
    if (held.tp && tp != par.tensor_parallel_degree) continue;
    if (shape.n_heads % tp != 0 || shape.n_kv_heads % tp != 0 || (tp > 1 && (shape.tied || !shape.tensor_parallel)))
      continue;
    for (int64_t cp = 1; cp <= (split ? 8 : 1) && tp * cp <= search.gpus; cp *= 2) {
      if (config.training.seq_len % (cp * (cp > 1 ? 2 : 1) * tp) != 0) continue;
      if (held.cp && cp != par.context_parallel_degree) continue;
      for (int64_t pp = 1; tp * cp * pp <= search.gpus && pp <= (split ? shape.n_layers / 2 : 1); pp *= 2) {
        if (search.gpus % (tp * cp * pp) != 0 || (held.pp && pp != par.pipeline_parallel_degree)) continue;
        const int64_t dp = search.gpus / (tp * cp * pp);
        if (held.dp_shard && dp != par.data_parallel_shard_degree) continue;
        if (global % dp != 0) continue;
        const int64_t per_rank = global / dp;  // sequences per dp rank per step
        // EP borrows its ranks from dp_shard x cp and must divide the experts (1 for a dense model).
        for (int64_t ep = 1; ep <= dp * cp; ep *= 2) {
          if ((dp * cp) % ep != 0 || (ep > 1 && (shape.moe_num_experts == 0 || shape.moe_num_experts % ep != 0)))
            continue;
          if (held.ep && ep != par.expert_parallel_degree) continue;
          for (int64_t mb = 1; mb <= per_rank; mb *= 2) {
            if (per_rank % mb != 0) continue;
            if (held.microbatch &&
                mb != (pp > 1 ? par.pipeline_parallel_microbatch_size : config.training.local_batch_size))
              continue;
            // ETP, when the config asks for it, is tp itself.
            const int64_t etp = par.expert_tensor_parallel_degree > 1 ? tp : 1;
            Layout l{.mesh = {.pp = pp, .dp_replicate = 1, .dp_shard = dp, .cp = cp, .tp = tp, .ep = ep, .etp = etp}};
            if (pp > 1) {
              l.local_batch = per_rank;
              l.accumulation = 1;
              l.microbatch = mb;
              if (per_rank / mb < pp) continue;  // the schedule needs pp microbatches
            } else {
              l.local_batch = mb;
              l.accumulation = per_rank / mb;
              l.microbatch = mb;
            }
            for (const AcPolicy& ac : policies) {
              l.ac = ac;
              MemoryPlan plan;
              try {
                plan = detail::evaluate(c, l);
              } catch (const c10::Error&) {
                continue;  // a split or schedule this layout cannot have (e.g. more stages than layers)
              }
              if (plan.fits()) fits.push_back(std::move(plan));
            }
          }
        }
      }
    }
  }
  // Fastest first; among equal speeds the one with more memory left at its reserved peak.
  std::sort(fits.begin(), fits.end(), [&](const MemoryPlan& a, const MemoryPlan& b) {
    if (a.tokens_per_second != b.tokens_per_second) return a.tokens_per_second > b.tokens_per_second;
    return a.headroom() > b.headroom();
  });
  if (static_cast<int64_t>(fits.size()) > search.limit) fits.resize(static_cast<size_t>(search.limit));
  return fits;
}

}  // namespace titan::models
