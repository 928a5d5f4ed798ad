// SPDX-License-Identifier: BSD-3-Clause
// Expert parallelism against one device: a model of two MoE layers (residual, shared experts,
// sigmoid scores, route_norm, top-2 of 8 experts, an expert bias strong enough to change routing)
// trained 6 SGD steps on fixed global batches, ranks as threads over Gloo in fp32. EP 2, EP 4,
// EP 2 x TP 2 (the MoE replicated over tp) and EP 2 x efsdp 2 (4 ranks: expert gradients summed
// over the efsdp pair) must reproduce one device:
// the loss and both layers' expert bias at every step, the first step's output and gradients, the
// final weights. Tolerances: the only differences are fp32 sums in another order (each rank's
// tokens, then the collective over ranks; the experts see their tokens in another row order,
// which does not change a row's result), ~1e-7 relative per reduction, so 1e-5 relative on losses
// and the bias, and 1e-5 relative + 1e-6 absolute on gradients and weights (SGD: no AdamW
// amplification of rounding-level gradients).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include <mutex>
#include <vector>

#include "dist/rank_test_util.hpp"
#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/dist/functional.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/moe.hpp"
#include "titan/parallel/expert_parallel.hpp"

namespace titan::test {
namespace {

constexpr int64_t kDim = 16;
constexpr int64_t kHidden = 32;
constexpr int64_t kBatch = 8;  // global sequences per step, split over the dp ranks
constexpr int64_t kSeq = 8;
constexpr int64_t kSteps = 6;
constexpr double kLr = 0.5;

// On the strict backend: expert parallelism's all-to-alls held to NCCL's rules (tests/dist/nccl_rules_test.cpp).
const dist::MeshOptions kFastMesh = titan::test::mesh_options();

nn::MoEArgs moe_args(int64_t experts) {
  return {.num_experts = experts,
          .num_shared_experts = 1,
          .score_func = "sigmoid",
          .route_norm = true,
          .route_scale = 1.0,
          .top_k = 2,
          .load_balance_coeff = 2e-2};
}

// Two MoE layers with residuals: y = h + moe1(h), h = x + moe0(x).
struct TwoMoE : torch::nn::Module {
  explicit TwoMoE(int64_t experts) {
    const at::TensorOptions fp32 = at::TensorOptions().dtype(at::kFloat);
    moe0 = register_module("moe0", std::make_shared<nn::MoE>(moe_args(experts), kDim, kHidden, fp32));
    moe1 = register_module("moe1", std::make_shared<nn::MoE>(moe_args(experts), kDim, kHidden, fp32));
  }
  at::Tensor forward(const at::Tensor& x) const {
    const at::Tensor h = x + moe0->forward(x);  // (B, S, D)
    return h + moe1->forward(h);                // (B, S, D)
  }
  std::shared_ptr<nn::MoE> moe0, moe1;
};

struct Run {
  std::vector<double> losses;                   // global loss per step
  std::vector<std::vector<at::Tensor>> biases;  // per step: both layers' expert bias after the update
  at::Tensor first_output;                      // this rank's rows of the first step's output
  std::vector<at::Tensor> first_grads;          // whole gradients after step 1 (named_parameters order)
  std::vector<at::Tensor> weights;              // whole parameters after the last step
  std::vector<int64_t> dispatched_bytes;        // all-to-all bytes this rank sent over ep in step 1
};

// The whole tensor of p: expert weights gathered over ep.
at::Tensor whole(const at::Tensor& p, bool expert, const dist::Mesh& mesh) {
  return expert ? dist::detail::gather_along(p.detach(), mesh.group("ep"), 0) : p.detach().clone();
}

// skewed: an expert bias that sends every slot to experts 0-3 (under EP 2, the first rank's).
Run train(const dist::Mesh& mesh, bool skewed = false) {
  const int64_t experts = 8;
  nn::manual_init_seed(7);
  TwoMoE model(experts);
  model.moe0->init_weights(nn::InitSite::current() / "moe0", 0.02);
  model.moe1->init_weights(nn::InitSite::current() / "moe1", 0.02);
  {
    at::NoGradGuard no_grad;  // spread the router scores so the top-2 choice is far from ties
    model.moe0->router->gate->weight.mul_(25.0);
    model.moe1->router->gate->weight.mul_(25.0);
    if (skewed) {
      for (auto* moe : {model.moe0.get(), model.moe1.get()}) moe->expert_bias.narrow(0, 0, experts / 2).fill_(10.0);
    }
  }
  parallel::ExpertParallel ep = parallel::apply_expert_parallel(model, mesh, {.moe_modules = {"moe0", "moe1"}});
  std::vector<const void*> expert_impls;
  for (const at::Tensor& p : ep.expert_parameters()) expert_impls.push_back(p.unsafeGetTensorImpl());
  auto is_expert = [&](const at::Tensor& p) {
    return std::find(expert_impls.begin(), expert_impls.end(), p.unsafeGetTensorImpl()) != expert_impls.end();
  };
  const int64_t dp = mesh.size("dp");
  const int64_t rows = kBatch / dp;
  const int64_t first = mesh.coordinate("dp") * rows;
  Run run;
  for (int64_t step = 1; step <= kSteps; ++step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
    const at::Tensor x = at::randn({kBatch, kSeq, kDim}, gen);     // (B, S, D) global
    const at::Tensor target = x.roll(1, -1);                       // (B, S, D): learnable
    const at::Tensor y = model.forward(x.narrow(0, first, rows));  // (B/dp, S, D)
    // Normalised by the global element count: the ranks' losses add up to one device's.
    const at::Tensor loss =
        (y - target.narrow(0, first, rows)).pow(2).sum() / static_cast<double>(kBatch * kSeq * kDim);
    loss.backward();
    for (const auto& item : model.named_parameters()) {
      if (!is_expert(item.value())) {  // replicated: router gates, shared experts
        at::Tensor g = item.value().grad();
        mesh.group("dp_cp").all_reduce(g).wait();
      }
    }
    ep.reduce_expert_gradients();
    at::Tensor total = loss.detach().clone();
    mesh.group("dp_cp").all_reduce(total).wait();
    run.losses.push_back(total.item<double>());
    if (step == 1) {
      run.first_output = y.detach().clone();
      for (const auto& item : model.named_parameters())
        run.first_grads.push_back(whole(item.value().grad(), is_expert(item.value()), mesh));
      const dist::CommStats stats = mesh.group("ep").stats();
      run.dispatched_bytes.push_back(stats.other_bytes);
    }
    {
      at::NoGradGuard no_grad;
      for (auto& p : model.parameters()) {
        p.sub_(kLr * p.grad());
        p.mutable_grad().zero_();
      }
    }
    ep.update_expert_bias();
    run.biases.push_back({model.moe0->expert_bias.clone(), model.moe1->expert_bias.clone()});
  }
  for (const auto& item : model.named_parameters())
    run.weights.push_back(whole(item.value(), is_expert(item.value()), mesh));
  return run;
}

const Run& one_device(bool skewed) {
  static const Run run = train(dist::Mesh());
  static const Run skewed_run = train(dist::Mesh(), /*skewed=*/true);
  return skewed ? skewed_run : run;
}

void check_against_one_device(const dist::MeshShape& shape, bool skewed = false) {
  const Run& ref = one_device(skewed);
  std::mutex mutex;
  std::vector<Run> runs(static_cast<size_t>(shape.world_size()));
  dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(shape, rank, store, kFastMesh);
    Run r = train(mesh, skewed);
    std::lock_guard lock(mutex);
    runs[static_cast<size_t>(rank)] = std::move(r);
  });
  const int64_t rows = kBatch / shape.dp();
  for (size_t rank = 0; rank < runs.size(); ++rank) {
    const Run& r = runs[rank];
    INFO(fmt::format("ep {} of {}, rank {}", shape.ep, shape, rank));
    REQUIRE(r.losses.size() == ref.losses.size());
    for (size_t s = 0; s < r.losses.size(); ++s) {
      INFO("step " << s + 1 << " loss " << r.losses[s] << " vs " << ref.losses[s]);
      CHECK(r.losses[s] == Approx(ref.losses[s]).epsilon(1e-5));
      for (size_t layer = 0; layer < 2; ++layer) {
        INFO("layer " << layer << " bias " << r.biases[s][layer] << " vs " << ref.biases[s][layer]);
        CHECK(at::allclose(r.biases[s][layer], ref.biases[s][layer], 1e-5, 1e-8));
      }
    }
    // The ep ranks really exchanged tokens, not only the counts (2 layers x at most 8 int64 each).
    CHECK(r.dispatched_bytes.at(0) > 2 * 8 * 8);
    const int64_t dp_rank = static_cast<int64_t>(rank) / shape.tp;  // dp_shard x tp meshes, tp fastest
    CHECK(at::allclose(r.first_output, ref.first_output.narrow(0, dp_rank * rows, rows), 1e-5, 1e-6));
    REQUIRE(r.first_grads.size() == ref.first_grads.size());
    for (size_t i = 0; i < r.first_grads.size(); ++i) {
      INFO("gradient " << i << " max abs diff " << (r.first_grads[i] - ref.first_grads[i]).abs().max().item<double>());
      CHECK(at::allclose(r.first_grads[i], ref.first_grads[i], 1e-5, 1e-6));
    }
    for (size_t i = 0; i < r.weights.size(); ++i) {
      INFO("weight " << i << " max abs diff " << (r.weights[i] - ref.weights[i]).abs().max().item<double>());
      CHECK(at::allclose(r.weights[i], ref.weights[i], 1e-5, 1e-6));
    }
  }
  // The bias really moved and steered: it is not all zeros. (The loss tells nothing of training here: the 6
  // SGD steps move it by ~1e-5, at lr 50 as at 0.5, while the batches alone move it by ~0.15.)
  CHECK(ref.biases.back()[0].abs().max().item<double>() > 0.0);
}

}  // namespace

TEST_CASE("EP 2 matches one device: losses, expert bias, gradients, weights", "[parallel][ep][parity]") {
  check_against_one_device({.dp_shard = 2, .ep = 2});
}

TEST_CASE("EP 4 matches one device: losses, expert bias, gradients, weights", "[parallel][ep][parity]") {
  check_against_one_device({.dp_shard = 4, .ep = 4});
}

TEST_CASE("EP 2 x efsdp 2 matches one device: expert gradients summed over the efsdp pair", "[parallel][ep][parity]") {
  check_against_one_device({.dp_shard = 4, .ep = 2});
}

TEST_CASE("EP 2 with every slot routed to one rank's experts (the other computes none) matches one device",
          "[parallel][ep][parity]") {
  check_against_one_device({.dp_shard = 2, .ep = 2}, /*skewed=*/true);
}

TEST_CASE("EP 2 x TP 2 matches one device: the MoE layers replicated over tp, ep inside dp_shard",
          "[parallel][ep][parity]") {
  // The tp pair of a dp rank sees the same tokens and holds the same experts (etp = 1): each runs
  // the layer whole; the ep group pairs the ranks with the same tp coordinate.
  check_against_one_device({.dp_shard = 2, .tp = 2, .ep = 2});
}

TEST_CASE("the ep axis is carved from dp_shard x cp, ep fastest (torchtitan's sparse mesh)", "[parallel][ep]") {
  std::mutex mutex;
  std::vector<std::vector<int64_t>> ep_groups(4), efsdp_groups(4);
  std::vector<std::string> descriptions(4);
  std::vector<std::vector<int64_t>> w1_shapes(4);
  dist::run_local_ranks(4, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 2, .cp = 2, .ep = 2}, rank, store, kFastMesh);
    TwoMoE model(8);
    const std::string described = parallel::apply_expert_parallel(model, mesh, {.moe_modules = {"moe1"}}).describe();
    const auto shape = model.moe1->experts->w1.sizes().vec();
    std::lock_guard lock(mutex);
    descriptions[static_cast<size_t>(rank)] = described;
    w1_shapes[static_cast<size_t>(rank)] = shape;
    ep_groups[static_cast<size_t>(rank)] = mesh.group("ep").global_ranks();
    efsdp_groups[static_cast<size_t>(rank)] = mesh.group("efsdp").global_ranks();
  });
  // dp_shard_cp index = dp_shard * cp + cp = the world rank here; ep = index % 2, efsdp = index / 2.
  CHECK(ep_groups[0] == std::vector<int64_t>{0, 1});
  CHECK(ep_groups[3] == std::vector<int64_t>{2, 3});
  CHECK(efsdp_groups[0] == std::vector<int64_t>{0, 2});
  CHECK(efsdp_groups[1] == std::vector<int64_t>{1, 3});
  CHECK(descriptions[0] == "EP(ep=2, efsdp=2, MoE layers: 1)");
  CHECK(w1_shapes[3] == std::vector<int64_t>{4, kHidden, kDim});  // 8 experts / ep 2
  // The plan of a model whose MoE layers all go EP.
  TwoMoE model(8);
  const parallel::ExpertParallelPlan plan{.moe_modules = parallel::moe_modules(model)};
  CHECK(plan.moe_modules == std::vector<std::string>{"moe0", "moe1"});
  CHECK(fmt::format("{}", plan) == "ExpertParallel(moe0, moe1)");
  CHECK(parallel::apply_expert_parallel(model, dist::Mesh(), plan).describe() == "no EP");
  // One process: the groups exist with one rank.
  const dist::Mesh single;
  CHECK(single.size("ep") == 1);
  CHECK(single.size("efsdp") == 1);
}

TEST_CASE("a bad expert-parallel degree is refused with the fix", "[parallel][ep]") {
  ParallelismConfig p;
  p.data_parallel_shard_degree = 4;
  p.expert_parallel_degree = 3;
  CHECK_THROWS_WITH(
      dist::mesh_shape(p, 4),
      Catch::Contains("expected expert_parallel_degree dividing dp_shard(4) * cp(1) = 4") && Catch::Contains("got 3"));
  JobConfig job;
  job.parallelism.data_parallel_shard_degree = 4;
  job.parallelism.expert_parallel_degree = 3;
  CHECK_THROWS_WITH(titan::validate(job),
                    Catch::Contains("expected parallelism.expert_parallel_degree to divide "
                                    "data_parallel_shard_degree * context_parallel_degree = 4, got 3"));
  // ep divides dp_shard (3 ranks) but not the 8 experts: apply names the layer. (Catch's CHECK is
  // not thread-safe: the ranks keep the messages, the test thread checks them.)
  std::mutex mutex;
  std::vector<std::string> not_dividing(3), not_moe(3);
  dist::run_local_ranks(3, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 3, .ep = 3}, rank, store, kFastMesh);
    TwoMoE model(8);
    auto message = [&](const std::string& path) {
      return error_of([&] { (void)parallel::apply_expert_parallel(model, mesh, {.moe_modules = {path}}); });
    };
    const std::string a = message("moe0"), b = message("moe0.router");
    std::lock_guard lock(mutex);
    not_dividing[static_cast<size_t>(rank)] = a;
    not_moe[static_cast<size_t>(rank)] = b;
  });
  for (int rank = 0; rank < 3; ++rank) {
    CHECK_THAT(
        not_dividing[rank],
        Catch::Contains("expected parallelism.expert_parallel_degree to divide the 8 experts of 'moe0', got ep 3"));
    CHECK_THAT(not_moe[rank], Catch::Contains("expected plan.expert_parallel path 'moe0.router' to name an nn::MoE"));
  }
}

}  // namespace titan::test
