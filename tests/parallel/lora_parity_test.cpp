// SPDX-License-Identifier: BSD-3-Clause
// LoRA under FSDP 2 x TP 2 (ranks as threads, the strict backend) trains as one process does: Llama 3 and a small
// Qwen3-MoE (two MoE blocks around a dense one), adapters on every Linear they may have, each run converted, planned,
// parallelized and initialised as RankModel does it (nn::add_lora, parallel::plan, parallelize, init_weights,
// nn::init_lora), AdamW on the adapters only. Per step the losses and grad norms, after the last step every adapter,
// match one process; the frozen base weights never get a gradient and end bitwise as they started. The adapters sit
// where their Linear's TP style puts them: a colwise Linear's A whole and B split with the output features, a
// rowwise Linear's A split with the input features and B whole.
//
// Tolerances are the parity tests' (tests/parallel/parity_check.hpp): fp32 sums reordered across ranks, ~1e-7
// relative per reduction, amplified by AdamW where a gradient is near rounding level: 1e-5 relative on losses and
// grad norms, 1e-4 relative + 2e-5 absolute on the adapters (the Qwen3 parity test's, lr 3e-3). B starts at zero, so
// step 1 moves B only and every later step both: a misplaced adapter (a partial gradient left unsummed, a shard
// taken for the whole) shows from step 2 on, in the losses and grad norms.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <functional>
#include <map>
#include <mutex>

#include "dist/rank_test_util.hpp"
#include "models/small_models.hpp"
#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/models/qwen3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/lora.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/optim/clip.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/step.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace lora_parity_test {

using namespace titan;

constexpr int64_t kSteps = 5;
constexpr int64_t kBatch = 4;  // sequences per step, split over the dp ranks
constexpr int64_t kSeq = 16;
constexpr int64_t kVocab = 128;
constexpr double kLr = 3e-3;

using BuildModel = std::function<std::shared_ptr<models::Decoder>()>;

struct Result {
  std::vector<double> losses;                     // global loss per step
  std::vector<double> grad_norms;                 // global grad norm of the adapters per step
  std::vector<std::string> names;                 // the adapters' FQNs
  std::vector<at::Tensor> adapters;               // whole, after the last step
  std::map<std::string, std::string> placements;  // each parameter's placements on this rank
  int64_t frozen = 0;                             // frozen tensors
  int64_t frozen_with_grad = 0;                   // of those, any with a gradient after a step
  int64_t frozen_changed = 0;                     // of those, any whose local values changed over training
};

Result train(const dist::Mesh& mesh, const BuildModel& build) {
  nn::manual_init_seed(42);
  const std::shared_ptr<models::Decoder> model = build();
  nn::add_lora(*model, {.rank = 4, .alpha = 8});
  JobConfig config;
  config.activation_checkpoint.mode = AcMode::none;
  const parallel::ParallelPlan plan =
      parallel::plan(model->sharding_spec(), parallel::plan_options(config, *model, false), mesh.shape());
  const Parallelized applied = parallelize(*model, mesh, plan);
  model->init_weights();
  nn::init_lora(*model);
  Result result;
  std::vector<at::Tensor> trained;
  std::vector<std::pair<at::Tensor, at::Tensor>> frozen;  // (parameter, its values at the start)
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    const parallel::ShardedParam* sharded = parallel::sharded_param(p);
    result.placements[item.key()] = sharded != nullptr ? sharded->placements_str() : "";
    if (!p.requires_grad()) {
      frozen.emplace_back(p, p.detach().clone());
      continue;
    }
    trained.push_back(p);
    result.names.push_back(item.key());
  }
  result.frozen = static_cast<int64_t>(frozen.size());
  AdamW optimizer(trained, {.lr = kLr, .weight_decay = 0.1});
  const LossFn loss = [&applied](const at::Tensor& logits, const at::Tensor& labels) {
    return applied.cross_entropy_sum(logits, labels);
  };
  const int64_t local = kBatch / mesh.size("dp");
  for (int64_t step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    // Learnable sequences: arithmetic progressions mod V, the same global batch on every rank.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
    const at::Tensor start = at::randint(kVocab, {kBatch, 1}, gen, at::kLong);                       // (B, 1)
    const at::Tensor stride = at::randint(1, 5, {kBatch, 1}, gen, at::kLong);                        // (B, 1)
    const at::Tensor tokens = (start + stride * at::arange(kSeq + 1, at::kLong)).remainder(kVocab);  // (B, S+1)
    const int64_t row = mesh.coordinate("dp") * local;
    const std::vector<Microbatch> micro{{.input = tokens.narrow(0, row, local).narrow(1, 0, kSeq).contiguous(),
                                         .labels = tokens.narrow(0, row, local).narrow(1, 1, kSeq).contiguous()}};
    const double local_loss =
        forward_backward([&](const at::Tensor& t, const nn::AttentionContext& c) { return model->forward(t, c); },
                         micro, at::kCPU, kBatch * kSeq, false, loss)
            .loss;
    at::Tensor global = at::full({1}, local_loss, at::kDouble);
    mesh.group("dp_cp").all_reduce(global).wait();
    result.losses.push_back(global.item<double>());
    result.grad_norms.push_back(clip_grad_norm_(trained, 1.0, &mesh));
    for (const auto& [p, _] : frozen) result.frozen_with_grad += p.grad().defined() ? 1 : 0;
    optimizer.step(kLr);
  }
  for (const auto& [p, start] : frozen) result.frozen_changed += at::equal(p.detach(), start) ? 0 : 1;
  for (const at::Tensor& p : trained) result.adapters.push_back(parallel::full_tensor(p, mesh));
  return result;
}

std::vector<Result> check_against_one_process(const dist::MeshShape& shape, const BuildModel& build) {
  const Result one = train(dist::Mesh(), build);
  std::mutex mutex;
  std::vector<Result> results(static_cast<size_t>(shape.world_size()));
  dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(shape, rank, store, test::mesh_options(std::chrono::seconds(120)));
    Result r = train(mesh, build);
    std::lock_guard lock(mutex);
    results[static_cast<size_t>(rank)] = std::move(r);
  });
  CHECK(one.frozen > 0);
  CHECK(one.frozen_with_grad == 0);
  CHECK(one.frozen_changed == 0);
  for (size_t rank = 0; rank < results.size(); ++rank) {
    const Result& r = results[rank];
    INFO(fmt::format("{} rank {}", shape, rank));
    CHECK(r.frozen == one.frozen);
    CHECK(r.frozen_with_grad == 0);
    CHECK(r.frozen_changed == 0);
    REQUIRE(r.losses.size() == one.losses.size());
    for (size_t s = 0; s < r.losses.size(); ++s) {
      INFO("step " << s + 1 << " loss " << r.losses[s] << " vs " << one.losses[s]);
      CHECK(r.losses[s] == Approx(one.losses[s]).epsilon(1e-5));
      CHECK(r.grad_norms[s] == Approx(one.grad_norms[s]).epsilon(1e-5));
    }
    REQUIRE(r.names == one.names);
    for (size_t i = 0; i < r.adapters.size(); ++i) {
      INFO(r.names[i] << " max abs diff " << (r.adapters[i] - one.adapters[i]).abs().max().item<double>());
      CHECK(at::allclose(r.adapters[i], one.adapters[i], 1e-4, 2e-5));
    }
  }
  // The adapters moved: B from zero, A from its init.
  const auto b = std::find(one.names.begin(), one.names.end(), "layers.0.attention.wq.lora_b.weight");
  REQUIRE(b != one.names.end());
  CHECK(one.adapters[static_cast<size_t>(b - one.names.begin())].abs().max().item<double>() > 1e-4);
  return results;
}

TEST_CASE("LoRA on Llama 3 under FSDP 2 x TP 2 trains as one process, base frozen", "[parallel][lora][parity]") {
  const std::vector<Result> results = check_against_one_process({.dp_shard = 2, .tp = 2}, [] {
    return std::make_shared<llama3::Llama3>(test::small_llama3(), kSeq, at::TensorOptions());
  });
  // Colwise wq: A whole over tp, B split with the output features; rowwise wo: A split with the input features.
  const auto& placed = results[0].placements;
  CHECK(placed.at("layers.0.attention.wq.weight") == "tp:Shard(0) dp_shard:Shard(0)");  // frozen, still sharded
  CHECK(placed.at("layers.0.attention.wq.lora_a.weight") == "dp_shard:Shard(0)");
  CHECK(placed.at("layers.0.attention.wq.lora_b.weight") == "tp:Shard(0) dp_shard:Shard(0)");
  CHECK(placed.at("layers.0.attention.wo.lora_a.weight") == "tp:Shard(1) dp_shard:Shard(0)");
  CHECK(placed.at("layers.0.attention.wo.lora_b.weight") == "dp_shard:Shard(0)");
  CHECK(placed.at("output.lora_b.weight") == "tp:Shard(0) dp_shard:Shard(0)");
}

TEST_CASE("LoRA on Qwen3-MoE under FSDP 2 x TP 2 trains as one process, base and experts frozen",
          "[parallel][lora][parity][moe]") {
  const std::vector<Result> results = check_against_one_process({.dp_shard = 2, .tp = 2}, [] {
    return std::make_shared<qwen3::Qwen3>(test::small_qwen3_moe(), kSeq, at::TensorOptions());
  });
  for (const std::string& name : results[0].names) {
    INFO(name);
    CHECK(name.find(".moe.") == std::string::npos);
  }
  CHECK(results[0].placements.at("layers.1.feed_forward.w2.lora_a.weight") == "tp:Shard(1) dp_shard:Shard(0)");
}

}  // namespace lora_parity_test
