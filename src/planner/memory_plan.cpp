// SPDX-License-Identifier: BSD-3-Clause
// The planner's entry points: the MemoryPlanner over one model, the job's settings as the planner and
// parallel::plan read them (make_context, job_plan), the checks that name the key to change, and one plan. The
// search is memory_plan_search.cpp; one layout's parts memory_plan_evaluate.cpp.
#include "titan/planner/memory_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "memory_plan_detail.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/core/error.hpp"
#include "titan/float8/converter.hpp"
#include "titan/models/decoder_spec.hpp"
#include "titan/models/job_args.hpp"
#include "titan/models/model_spec.hpp"
#include "titan/nn/lora.hpp"

namespace titan::planner {
namespace detail {
namespace {

// The whole model converted as the job converts it (model.converters) when FSDP gathers the float8 Linears'
// weights in float8 (parallel::plan_options lists them): nothing else of a plan depends on the conversion.
const torch::nn::Module& converted_model(PlannerState& state, const JobConfig& config) {
  const bool float8 = std::any_of(config.model.converters.begin(), config.model.converters.end(),
                                  [](const std::string& n) { return is_float8_converter(n); });
  if (!float8 || !config.float8.enable_fsdp_float8_all_gather) return *state.whole;
  const std::string key = to_json(config).at("float8").dump();
  auto it = state.converted.find(key);
  if (it == state.converted.end()) {
    std::shared_ptr<models::Decoder> whole = state.build({});
    float8::convert_to_float8(*whole, float8::converter_options(config.float8));
    it = state.converted.emplace(key, std::move(whole)).first;
  }
  return *it->second;
}

}  // namespace

bool lora_converted(const JobConfig& config) {
  return std::find(config.model.converters.begin(), config.model.converters.end(), "lora") !=
         config.model.converters.end();
}

Context make_context(PlannerState& state, const JobConfig& config, const PlanOptions& options,
                     const Calibration& calibration) {
  // The family's attention memory model, or nn::Attention's.
  models::AttentionMemoryModel attention = models::model_spec(config.model.name).attention_memory;
  if (!attention) attention = models::nn_attention_memory;
  parallel::ShardingSpec spec = state.spec;
  if (config.parallelism.pipeline_parallel_split == PipelineSplitBy::flops &&
      config.training.seq_len != state.whole->seq_len()) {
    spec.pipeline_costs = models::pipeline_costs(*state.whole, config.training.seq_len);
  }
  Context context{.state = state,
                  .model = *state.whole,
                  .config = config,
                  .options = options,
                  .attention = std::move(attention),
                  .spec = std::move(spec),
                  .plan_options = parallel::plan_options(config, converted_model(state, config), options.gpu),
                  .calibration = calibration,
                  .params = state.whole->num_params()};
  context.trainable_params = context.params;
  if (lora_converted(config)) {
    const nn::LoraConversion lora = nn::add_lora(*state.build({}), nn::lora_options(config.lora));
    context.params = lora.adapter_params + lora.frozen_params;
    context.trainable_params = lora.adapter_params;
  }
  return context;
}

std::string ac_name(const ActivationCheckpointConfig& ac, const Context& c) {
  // The plan's own parser checks the mode and option (the trainer's errors).
  (void)parallel::activation_checkpoint_plan(c.spec.blocks, ac, !c.spec.moe.empty(), c.spec.model);
  if (ac.mode == AcMode::full) return "full";
  if (ac.mode != AcMode::selective) return "none";
  if (ac.selective_ac_option == "op") return "op";
  return fmt::format("selective {}", std::stoll(ac.selective_ac_option));
}

parallel::ParallelPlan job_plan(const Context& c, const Layout& l) {
  parallel::PlanOptions options = c.plan_options;
  options.activation_checkpoint = l.ac;
  options.parallelism.pipeline_parallel_microbatch_size = l.microbatch;
  return parallel::plan(c.spec, options, l.mesh);
}

}  // namespace detail

namespace {

// The config's batch on mesh m: local batch, gradient accumulation and microbatch size.
detail::Layout batch_layout(const JobConfig& config, const dist::MeshShape& mesh) {
  const ParallelismConfig& p = config.parallelism;
  const int64_t lbs = config.training.local_batch_size;
  const int64_t dp = mesh.dp();
  const int64_t global = config.training.global_batch_size > 0 ? config.training.global_batch_size : lbs * dp;
  if (global % (lbs * dp) != 0) {
    throw ConfigError("training.global_batch_size",
                      fmt::format("[titan::planner::plan_memory] expected training.global_batch_size divisible by "
                                  "local_batch_size x data-parallel degree = {} x {}, got {}. Change one of them.",
                                  lbs, dp, global));
  }
  detail::Layout l{.mesh = mesh, .ac = config.activation_checkpoint, .microbatch = lbs, .local_batch = lbs};
  l.accumulation = global / (lbs * dp);
  if (mesh.pp > 1) {
    l.microbatch = p.pipeline_parallel_microbatch_size;
    if (l.microbatch < 1 || lbs % l.microbatch != 0) {
      throw ConfigError("parallelism.pipeline_parallel_microbatch_size",
                        fmt::format("[titan::planner::plan_memory] expected pipeline_parallel_microbatch_size to "
                                    "divide training.local_batch_size ({}), got {}. Choose a divisor.",
                                    lbs, l.microbatch));
    }
  }
  return l;
}

}  // namespace

void detail::check_layout(const models::Decoder& model, const JobConfig& cfg, const dist::MeshShape& m) {
  const models::DecoderShape& shape = model.shape();
  TITAN_CHECK_VALUE(shape.n_heads % m.tp == 0 && shape.n_kv_heads % m.tp == 0,
                    "[titan::planner::plan_memory] expected n_heads ({}) and n_kv_heads ({}) divisible by "
                    "parallelism.tensor_parallel_degree, got {}. Choose a degree that divides both.",
                    shape.n_heads, shape.n_kv_heads, m.tp);
  TITAN_CHECK_NOT_IMPLEMENTED(shape.tensor_parallel || m.tp == 1,
                              "[titan::planner::plan_memory] expected tensor_parallel_degree 1 for {}, got {}: its "
                              "tensor parallelism is not built yet. Use data and expert parallelism.",
                              shape.where, m.tp);
  // The family's sharding spec says which of pipeline and context parallelism it refuses, and why (a tied flavor:
  // pipeline; DeepSeek-V3 with multi-token prediction: both); the plan quotes it as the trainer would.
  const parallel::ShardingSpec spec = model.sharding_spec();
  for (const auto& [axis, key, degree] :
       {std::tuple<std::string, const char*, int64_t>{"pp", "pipeline", m.pp}, {"cp", "context", m.cp}}) {
    const auto refused =
        std::find_if(spec.refused.begin(), spec.refused.end(), [&](const auto& r) { return r.axis == axis; });
    TITAN_CHECK_NOT_IMPLEMENTED(degree == 1 || refused == spec.refused.end(),
                                "[titan::planner::plan_memory] expected parallelism.{}_parallel_degree 1 for {}, got "
                                "{}: {}",
                                key, shape.where, degree, refused == spec.refused.end() ? "" : refused->reason);
  }
  if (m.ep > 1) {
    TITAN_CHECK_VALUE(shape.moe_num_experts > 0,
                      "[titan::planner::plan_memory] expected parallelism.expert_parallel_degree = 1 for a dense "
                      "model ({}), got {}. Set it to 1.",
                      shape.where, m.ep);
    if (shape.moe_num_experts % m.ep != 0) {
      throw ConfigError("parallelism.expert_parallel_degree",
                        fmt::format("[titan::planner::plan_memory] expected expert_parallel_degree to divide the "
                                    "{} experts, got {}. Choose a divisor of num_experts.",
                                    shape.moe_num_experts, m.ep));
    }
  }
  const int64_t divisor = m.cp * (m.cp > 1 ? 2 : 1) * m.tp;
  if (cfg.training.seq_len % divisor != 0) {
    throw ConfigError(
        "training.seq_len",
        fmt::format("[titan::planner::plan_memory] expected training.seq_len divisible by {} "
                    "(context_parallel_degree {}{} x tensor_parallel_degree {}), got {}. Choose a "
                    "multiple of {}.",
                    divisor, m.cp, m.cp > 1 ? " x 2 (headtail)" : "", m.tp, cfg.training.seq_len, divisor));
  }
}

void detail::check_options(const PlanOptions& o, int64_t world, const char* where) {
  TITAN_CHECK_VALUE(o.mfu >= 0 && o.mfu <= 1,
                    "[titan::planner::{}] expected an MFU in (0, 1] (0: the calibrated default), got {}. Pass e.g. "
                    "--mfu 40%.",
                    where, o.mfu);
  TITAN_CHECK_VALUE(o.gpus_per_node >= 1, "[titan::planner::{}] expected --gpus-per-node >= 1, got {}.", where,
                    o.gpus_per_node);
  TITAN_CHECK_VALUE(o.intra_node_bw > 0 && o.inter_node_bw > 0,
                    "[titan::planner::{}] expected bandwidths > 0 bytes/s, got --intra-node-bw {} and "
                    "--inter-node-bw {}. Pass e.g. --intra-node-bw 450GB --inter-node-bw 50GB.",
                    where, o.intra_node_bw, o.inter_node_bw);
  // A job of several nodes fills each; one smaller than a node is a part of one.
  TITAN_CHECK_VALUE(!o.gpu || world <= o.gpus_per_node || world % o.gpus_per_node == 0,
                    "[titan::planner::{}] expected --gpus to be a multiple of --gpus-per-node ({}) when it spans "
                    "nodes, got {}. Use whole nodes or set --gpus-per-node.",
                    where, o.gpus_per_node, world);
}

MemoryPlan detail::plan_memory(MemoryPlanner& planner, const JobConfig& config, const PlanOptions& options,
                               const Calibration& calibration) {
  const ParallelismConfig& p = config.parallelism;
  int64_t world = options.world_size;
  if (world == 0) {
    world = p.pipeline_parallel_degree * p.data_parallel_replicate_degree * p.context_parallel_degree *
            p.tensor_parallel_degree * std::max<int64_t>(p.data_parallel_shard_degree, 1);
  }
  TITAN_CHECK_VALUE(world >= 1, "[titan::planner::plan_memory] expected a world size >= 1, got {}. Pass --gpus N.",
                    world);
  check_options(options, world, "plan_memory");
  const dist::MeshShape mesh = dist::mesh_shape(p, world);
  check_layout(planner.model(), config, mesh);
  const Context c = make_context(planner.state(), config, options, calibration);
  return evaluate(c, batch_layout(config, mesh));
}

MemoryPlanner::MemoryPlanner(const JobConfig& config)
    : MemoryPlanner([config](const std::vector<std::string>& modules) {
        return models::build_model(config, 0, {.device = at::kMeta, .modules = modules});
      }) {}

MemoryPlanner::MemoryPlanner(MetaBuilder build) : state_(std::make_unique<detail::PlannerState>()) {
  state_->build = std::move(build);
  state_->whole = state_->build({});
  TITAN_CHECK_VALUE(
      state_->whole != nullptr && state_->whole->parameters().front().device().is_meta(),
      "[titan::planner::MemoryPlanner] expected the model built on the meta device, got {}. Build it "
      "with ModelBuild{{.device = at::kMeta}}: the planner allocates nothing.",
      state_->whole == nullptr ? std::string("none") : state_->whole->parameters().front().device().str());
  state_->spec = state_->whole->sharding_spec();
}

MemoryPlanner::~MemoryPlanner() = default;
MemoryPlanner::MemoryPlanner(MemoryPlanner&&) noexcept = default;
MemoryPlanner& MemoryPlanner::operator=(MemoryPlanner&&) noexcept = default;

const models::Decoder& MemoryPlanner::model() const { return *state_->whole; }

MemoryPlan MemoryPlanner::plan(const JobConfig& config, const PlanOptions& options) {
  return detail::plan_memory(*this, config, options, detail::Calibration{});
}

MemoryPlan plan_memory(const JobConfig& config, const PlanOptions& options) {
  return MemoryPlanner(config).plan(config, options);
}

std::vector<MemoryPlan> search_layouts(const JobConfig& config, const PlanOptions& options, const SearchOptions& what) {
  return MemoryPlanner(config).search(config, options, what);
}

}  // namespace titan::planner
