// SPDX-License-Identifier: BSD-3-Clause
// The constant initialisers fill the same whole tensor on every layout: a whole tensor, an FSDP shard with
// padding rows (left zero, as the random initialisers leave them), and a TP shard.
#include <ATen/ATen.h>

#include "parallel/parity_check.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/layers.hpp"
#include "titan/parallel/parallelize.hpp"

using namespace titan;

TEST_CASE("constant initialisers give the same whole tensor on one device, FSDP shards and TP shards",
          "[nn][init][constant]") {
  at::Tensor t = at::empty({3, 2});
  nn::constant_(t, 2.5);
  CHECK(at::equal(t, at::full({3, 2}, 2.5)));
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 2}, rank, store, test::kFast);
    // 5 rows over 2 ranks: 3 each, rank 1 with one padding row.
    nn::LayerNorm norm(5, 1e-5, at::TensorOptions());
    const Parallelized parallel = parallelize(norm, mesh, {.data_parallel = {.units = {}}});
    norm.reset_parameters();
    RANK_CHECK(norm.weight.size(0) == 3);
    RANK_CHECK(at::equal(parallel::full_tensor(norm.weight, mesh), at::ones({5})));
    RANK_CHECK(at::equal(parallel::full_tensor(norm.bias, mesh), at::zeros({5})));
    if (rank == 1) RANK_CHECK(norm.weight[2].item<double>() == 0.0);  // padding, no element of the whole tensor
  });
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2}, rank, store, test::kFast);
    auto linear = std::make_shared<nn::Linear>(4, 6, at::TensorOptions(), /*bias=*/true);
    parallel::ParallelPlan plan;
    plan.tensor_parallel.add("", parallel::ColwiseParallel{});
    const Parallelized parallel = parallelize(*linear, mesh, plan);
    nn::ones_(linear->bias);
    RANK_CHECK(linear->bias.size(0) == 3);
    RANK_CHECK(at::equal(parallel::full_tensor(linear->bias, mesh), at::ones({6})));
    nn::zeros_(linear->bias);
    RANK_CHECK(at::equal(parallel::full_tensor(linear->bias, mesh), at::zeros({6})));
  });
}
