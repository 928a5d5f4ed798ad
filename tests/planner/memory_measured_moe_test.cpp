// SPDX-License-Identifier: BSD-3-Clause
// The planner against the tracker for the MoE families: small Qwen3-MoE (a dense block, then MoE blocks with
// q/k norms, softmax routing with route_norm), DeepSeek-V3 (tiny: latent attention, a dense block, MoE blocks
// with shared experts) and gpt-oss (sinks, a sliding window, biased experts with the clamped SwiGLU) on CPU
// layouts, ranks as threads over Gloo: one rank without AC, with full AC and with per-op AC, FSDP 2, EP 2
// (dp_shard 2 borrowed by ep 2: experts split over ep, the rest FSDP-sharded) and FSDP 4 x EP 2 (two ranks
// hold each expert). Each rank runs the trainer's step (zero_grad, forward + loss + backward under the
// activations scope, AdamW) twice with titan's memory tracker installed, and the second step's figures are
// compared with the planner's.
//
// Tolerances: parameters, gradients and optimizer state are counts of tensors the plan knows exactly, so
// they must match to the byte. Activations and communication within 10%, as for Llama 3: the planner
// adds up the tensors autograd saves per op and its peak is a walk over the blocks, not an allocator
// trace, and under EP it assumes balanced routing (each rank receives the slots it sends) where the
// real router on random weights and tokens sends a few more to some experts than to others.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <functional>
#include <mutex>

#include "planner/memory_measured.hpp"
#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/deepseek_v3/model.hpp"
#include "titan/models/gpt_oss/model.hpp"
#include "titan/models/qwen3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/loss.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/planner/memory_plan.hpp"

namespace titan::test::memory_measured_moe_test {
namespace {

constexpr int64_t kSeqLen = 128;

// DeepSeek-V3's tiny flavor (MLA dims 32 latent, 16 + 8 q/k, 16 v; 8 experts top 3, 2 shared) with a
// smaller vocabulary, so the blocks, not the loss, hold most of the activations.
deepseek_v3::DeepSeekV3Args small_deepseek_v3() {
  deepseek_v3::DeepSeekV3Args a = deepseek_v3::flavor("tiny");
  a.vocab_size = 256;
  return a;
}

// gpt-oss's blocks (sinks, a 32-token window in even blocks, biased projections and experts, the clamped
// SwiGLU), shrunk: D 64, 2 blocks, 4 heads of 16 over 2 KV heads, 8 experts of 64 hidden, top 4.
gpt_oss::GptOssArgs small_gpt_oss() {
  gpt_oss::GptOssArgs a = gpt_oss::flavor("debugmodel");
  a.dim = 64;
  a.n_layers = 2;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.head_dim = 16;
  a.vocab_size = 256;
  a.moe_inter_dim = 64;
  a.sliding_window = 32;
  return a;
}

struct Family {
  std::string name;  // model.name: the planner's attention model
  // The model on a device; `modules`: a pipeline rank's part (empty: whole).
  std::function<std::shared_ptr<models::Decoder>(const at::Device&, const std::vector<std::string>& modules)> build;
};

const std::vector<Family>& families() {
  static const std::vector<Family> all = {
      {.name = "qwen3",
       .build = [](const at::Device& d, const std::vector<std::string>& m) -> std::shared_ptr<models::Decoder> {
         return std::make_shared<qwen3::Qwen3>(small_qwen3_moe(), kSeqLen, at::TensorOptions().device(d), m);
       }},
      {.name = "deepseek_v3",
       .build = [](const at::Device& d, const std::vector<std::string>& m) -> std::shared_ptr<models::Decoder> {
         return std::make_shared<deepseek_v3::DeepSeekV3>(small_deepseek_v3(), kSeqLen, at::TensorOptions().device(d),
                                                          m);
       }},
      {.name = "gpt_oss",
       .build = [](const at::Device& d, const std::vector<std::string>& m) -> std::shared_ptr<models::Decoder> {
         return std::make_shared<gpt_oss::GptOss>(small_gpt_oss(), kSeqLen, at::TensorOptions().device(d), m);
       }},
  };
  return all;
}

struct Case {
  std::string name;
  dist::MeshShape shape{};
  AcMode ac = AcMode::none;
  std::string ac_option = "2";
};

JobConfig job(const Family& f, const Case& c) {
  JobConfig config;
  config.model.name = f.name;
  config.training.seq_len = kSeqLen;
  config.training.local_batch_size = 4;
  config.parallelism.data_parallel_shard_degree = c.shape.dp_shard;
  config.parallelism.expert_parallel_degree = c.shape.ep;
  config.activation_checkpoint.mode = c.ac;
  config.activation_checkpoint.selective_ac_option = c.ac_option;
  return config;
}

std::vector<MemoryParts> measure(const Family& f, const Case& c) {
  const JobConfig config = job(f, c);
  return measure_ranks(c.shape,
                       [&](const dist::Mesh& mesh) { return measure_rank(*f.build(at::kCPU, {}), mesh, config); });
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {.name = "1 rank", .shape = {}},
      {.name = "1 rank full AC", .shape = {}, .ac = AcMode::full},
      {.name = "1 rank op AC", .shape = {}, .ac = AcMode::selective, .ac_option = "op"},
      {.name = "FSDP 2", .shape = {.dp_shard = 2}},
      {.name = "EP 2", .shape = {.dp_shard = 2, .ep = 2}},
      {.name = "FSDP 4 x EP 2", .shape = {.dp_shard = 4, .ep = 2}},
  };
  return all;
}

}  // namespace

TEST_CASE(
    "memory plan: Qwen3-MoE DeepSeek-V3 and gpt-oss CPU layouts with EP measured by the tracker within 10 percent",
    "[planner][memory_plan][dist][moe][full]") {
  for (const Family& f : families()) {
    for (const Case& c : cases()) {
      const JobConfig config = job(f, c);
      planner::MemoryPlanner memory_planner([&](const std::vector<std::string>& m) { return f.build(at::kMeta, m); });
      const planner::MemoryPlan plan = memory_planner.plan(config, {.world_size = c.shape.world_size(), .gpu = false});
      const std::vector<MemoryParts> measured = measure(f, c);
      for (size_t rank = 0; rank < measured.size(); ++rank) {
        const MemoryParts& m = measured[rank];
        const MemoryParts& p = plan.parts;
        // The figures the docs' accuracy table shows.
        fmt::print(
            "memory plan vs measured | {} | {} | rank {} | params {} / {} | grads {} / {} | optimizer {} / {} | "
            "activations {} / {} ({:.3f}) | communication {} / {} ({:.3f})\n",
            f.name, c.name, rank, p.parameters, m.parameters, p.gradients, m.gradients, p.optimizer, m.optimizer,
            p.activations, m.activations, ratio(p.activations, m.activations), p.communication, m.communication,
            ratio(p.communication, m.communication));
        INFO(fmt::format("{} {} rank {}", f.name, c.name, rank));
        CHECK(p.parameters == m.parameters);
        CHECK(p.gradients == m.gradients);
        CHECK(p.optimizer == m.optimizer);
        CHECK(std::abs(ratio(p.activations, m.activations) - 1.0) <= 0.10);
        CHECK(std::abs(ratio(p.communication, m.communication) - 1.0) <= 0.10);
      }
    }
  }
}

}  // namespace titan::test::memory_measured_moe_test