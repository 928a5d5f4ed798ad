// SPDX-License-Identifier: BSD-3-Clause
// The planner's parameter bytes against what titan::parallelize leaves on real meshes. Each rank of a CPU layout
// (ranks as threads over Gloo) does what the Trainer does: the plan from the whole model's sharding spec on the
// meta device, its own modules built on the CPU, the plan applied; the bytes of its parameters' storage are what
// it holds. The planner applies the same plan on the meta device over a planning mesh and reads one rank per pp
// rank. Layouts, for Llama 3's debug model and a small Qwen3-MoE alike: FSDP 3 (uneven rows: FSDP's padding), TP 2,
// TP 2 x FSDP 2; for Llama 3 also PP 2 x FSDP 2; for Qwen3-MoE also EP 2, FSDP 4 x EP 2 and TP 2 x FSDP 2 with EP 2
// and expert tensor parallelism; Qwen3.5-MoE's debug model under PP 2 x FSDP 2 x EP 2; DeepSeek-V3's tiny model with
// multi-token prediction under PP 2 x FSDP 2 (the last stage's copy of the embedding). Exact: both count the same
// tensors.
//
// And what keeps a new parallel feature from drifting: a model whose sharding spec keeps a layer whole under TP (an
// exception no rule in the planner knows) is planned as the runtime shards it.
#include <fmt/format.h>

#include <functional>
#include <mutex>

#include "dist/rank_test_util.hpp"
#include "planner/memory_measured.hpp"
#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/deepseek_v3/model.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/models/qwen3/model.hpp"
#include "titan/models/qwen3_5/model.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/planner/memory_plan.hpp"

namespace titan::test::memory_applied_test {
namespace {

// A family's model on a device; `modules`: a pipeline rank's part (empty: the whole model).
using Build = std::function<std::shared_ptr<models::Decoder>(const at::Device&, const std::vector<std::string>&)>;

// Llama 3's debug model: D 256, 6 blocks, 16 heads, vocab 2048 (256 rows split 3 ways: FSDP pads).
std::shared_ptr<models::Decoder> debug_llama(const at::Device& d, const std::vector<std::string>& modules) {
  return std::make_shared<llama3::Llama3>(llama3::flavor("debugmodel"), 256, at::TensorOptions().device(d), modules);
}

// memory_measured.hpp's small Qwen3-MoE (a dense block, then MoE blocks of 8 experts).
std::shared_ptr<models::Decoder> qwen3_moe(const at::Device& d, const std::vector<std::string>& modules) {
  return std::make_shared<qwen3::Qwen3>(small_qwen3_moe(), 128, at::TensorOptions().device(d), modules);
}

// Qwen3.5-MoE's debug model: 8 blocks, Gated DeltaNet in three of four, each an MoE of 8 experts with a gated shared
// expert.
std::shared_ptr<models::Decoder> debug_qwen3_5_moe(const at::Device& d, const std::vector<std::string>& modules) {
  return std::make_shared<qwen3_5::Qwen35>(qwen3_5::moe_flavor("debugmodel_moe"), 128, at::TensorOptions().device(d),
                                           modules);
}

// DeepSeek-V3's tiny flavor with one multi-token prediction depth: under PP the last stage holds the depth and a copy
// of the first stage's embedding (2048 x 64), which makes it the largest.
std::shared_ptr<models::Decoder> tiny_deepseek_mtp(const at::Device& d, const std::vector<std::string>& modules) {
  deepseek_v3::DeepSeekV3Args args = deepseek_v3::flavor("tiny");
  args.max_seq_len = 128;
  args.num_nextn_predict_layers = 1;
  return std::make_shared<deepseek_v3::DeepSeekV3>(args, 128, at::TensorOptions().device(d), modules);
}

JobConfig job(const std::string& family, const dist::MeshShape& shape) {
  JobConfig config;
  config.model.name = family;
  config.training.seq_len = 128;
  config.parallelism.pipeline_parallel_degree = shape.pp;
  config.parallelism.data_parallel_shard_degree = shape.dp_shard;
  config.parallelism.tensor_parallel_degree = shape.tp;
  config.parallelism.expert_parallel_degree = shape.ep;
  config.parallelism.expert_tensor_parallel_degree = shape.etp;
  return config;
}

// Per rank (in rank order): its pp coordinate and the bytes of its parameters once the job's plan is applied.
std::vector<std::pair<int64_t, int64_t>> held_bytes(const Build& build, const JobConfig& config,
                                                    const dist::MeshShape& shape) {
  std::vector<std::pair<int64_t, int64_t>> out(static_cast<size_t>(shape.world_size()));
  std::mutex mutex;
  dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(shape, rank, store, mesh_options(std::chrono::seconds(120)));
    const auto whole = build(at::kMeta, {});
    const parallel::ParallelPlan plan =
        parallel::plan(whole->sharding_spec(), parallel::plan_options(config, *whole, false), mesh.shape());
    const auto model = build(at::kCPU, plan.pipeline.stages.empty() ? std::vector<std::string>{}
                                                                    : parallel::pipeline_modules(plan.pipeline, mesh));
    const Parallelized applied = parallelize(*model, mesh, plan);
    const std::lock_guard lock(mutex);
    out[static_cast<size_t>(rank)] = {mesh.coordinate("pp"), storage_bytes(model->unique_parameters())};
  });
  return out;
}

planner::MemoryPlan planned(const Build& build, const JobConfig& config, const dist::MeshShape& shape) {
  planner::MemoryPlanner memory_planner([&](const std::vector<std::string>& m) { return build(at::kMeta, m); });
  return memory_planner.plan(config, {.world_size = shape.world_size(), .gpu = false});
}

struct Case {
  std::string name;
  std::string family;
  Build build;
  dist::MeshShape shape{};
};

}  // namespace

TEST_CASE("memory plan: parameter bytes are what parallelize leaves on every rank of real meshes",
          "[planner][memory_plan][dist]") {
  const std::vector<Case> cases = {
      {.name = "FSDP 3", .family = "llama3", .build = debug_llama, .shape = {.dp_shard = 3}},
      {.name = "TP 2", .family = "llama3", .build = debug_llama, .shape = {.tp = 2}},
      {.name = "TP 2 x FSDP 2", .family = "llama3", .build = debug_llama, .shape = {.dp_shard = 2, .tp = 2}},
      {.name = "PP 2 x FSDP 2", .family = "llama3", .build = debug_llama, .shape = {.pp = 2, .dp_shard = 2}},
      {.name = "FSDP 3", .family = "qwen3", .build = qwen3_moe, .shape = {.dp_shard = 3}},
      {.name = "TP 2", .family = "qwen3", .build = qwen3_moe, .shape = {.tp = 2}},
      {.name = "TP 2 x FSDP 2", .family = "qwen3", .build = qwen3_moe, .shape = {.dp_shard = 2, .tp = 2}},
      {.name = "EP 2", .family = "qwen3", .build = qwen3_moe, .shape = {.dp_shard = 2, .ep = 2}},
      {.name = "FSDP 4 x EP 2", .family = "qwen3", .build = qwen3_moe, .shape = {.dp_shard = 4, .ep = 2}},
      {.name = "TP 2 x FSDP 2 x EP 2 x ETP 2",
       .family = "qwen3",
       .build = qwen3_moe,
       .shape = {.dp_shard = 2, .tp = 2, .ep = 2, .etp = 2}},
      {.name = "PP 2 x FSDP 2 x EP 2",
       .family = "qwen3_5_moe",
       .build = debug_qwen3_5_moe,
       .shape = {.pp = 2, .dp_shard = 2, .ep = 2}},
      {.name = "PP 2 x FSDP 2 with multi-token prediction",
       .family = "deepseek_v3",
       .build = tiny_deepseek_mtp,
       .shape = {.pp = 2, .dp_shard = 2}},
  };
  for (const Case& c : cases) {
    const JobConfig config = job(c.family, c.shape);
    const planner::MemoryPlan plan = planned(c.build, config, c.shape);
    int64_t compared = 0;
    for (const auto& [pp_rank, bytes] : held_bytes(c.build, config, c.shape)) {
      fmt::print("memory plan vs parallelize | {} {} | pp rank {} | planned {} (pp rank {}) | held {}\n", c.family,
                 c.name, pp_rank, plan.parts.parameters, plan.pp_rank, bytes);
      INFO(fmt::format("{} {}: pp rank {}", c.family, c.name, pp_rank));
      if (pp_rank != plan.pp_rank) continue;  // the plan shows one pp rank: the one with the largest total
      CHECK(plan.parts.parameters == bytes);
      ++compared;
    }
    CHECK(compared == c.shape.world_size() / c.shape.pp);
    // The depth and the embedding's copy make the last stage the one shown: the copy's bytes are planned.
    if (c.family == "deepseek_v3") CHECK(plan.pp_rank == 1);
  }
}

namespace {

// Llama 3 whose last block's feed-forward stays whole under tensor parallelism, declared in its sharding spec (the
// model's own exception): the block's sequence shard goes through whole w1, w2, w3, whose gradients tp sums.
class WholeLastFeedForward : public llama3::Llama3 {
 public:
  using Llama3::Llama3;
  parallel::ShardingSpec sharding_spec() const override {
    parallel::ShardingSpec spec = Llama3::sharding_spec();
    const std::string ffn = fmt::format("layers.{}.feed_forward", shape().n_layers - 1);
    auto& roles = spec.tensor_parallel;
    const auto first =
        std::find_if(roles.begin(), roles.end(), [&](const auto& e) { return e.first.starts_with(ffn); });
    const auto at =
        roles.erase(first, std::find_if(first, roles.end(), [&](const auto& e) { return !e.first.starts_with(ffn); }));
    roles.insert(at, {{ffn + ".w1", parallel::TensorParallelRole::replicated},
                      {ffn + ".w3", parallel::TensorParallelRole::replicated},
                      {ffn + ".w2", parallel::TensorParallelRole::replicated}});
    return spec;
  }
};

std::shared_ptr<models::Decoder> whole_last_ffn(const at::Device& d, const std::vector<std::string>& modules) {
  return std::make_shared<WholeLastFeedForward>(llama3::flavor("debugmodel"), 256, at::TensorOptions().device(d),
                                                modules);
}

}  // namespace

TEST_CASE("memory plan: a layer a model's sharding spec keeps whole under TP is planned as parallelize shards it",
          "[planner][memory_plan][dist]") {
  const dist::MeshShape shape{.dp_shard = 2, .tp = 2};
  const JobConfig config = job("llama3", shape);
  const planner::MemoryPlan plain = planned(debug_llama, config, shape);
  const planner::MemoryPlan whole = planned(whole_last_ffn, config, shape);
  // The block's three (F, D) matrices (D 256, F 768) are no longer split over tp: each rank holds the other half
  // too, FSDP-split in two (fp32).
  const int64_t D = 256, F = 768;
  CHECK(whole.parts.parameters - plain.parts.parameters == 3 * D * F / 2 / 2 * 4);
  for (const auto& [pp_rank, bytes] : held_bytes(whole_last_ffn, config, shape)) CHECK(whole.parts.parameters == bytes);
}

}  // namespace titan::test::memory_applied_test