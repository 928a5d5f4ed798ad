// SPDX-License-Identifier: BSD-3-Clause
// Mesh layout and the differentiable collectives, on the strict backend with ranks as threads.
#include <ATen/ATen.h>

#include "dist/rank_test_util.hpp"
#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/functional.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"

using namespace titan;

namespace {
const dist::MeshOptions kFast = test::mesh_options();
}

TEST_CASE("mesh_shape infers dp_shard and names every factor on a mismatch", "[dist][mesh]") {
  ParallelismConfig p;
  p.data_parallel_replicate_degree = 2;
  p.tensor_parallel_degree = 2;
  const dist::MeshShape s = dist::mesh_shape(p, 8);
  CHECK(s.dp_shard == 2);
  CHECK(s.dp() == 4);
  p.data_parallel_shard_degree = 4;
  try {
    dist::mesh_shape(p, 8);
    FAIL("expected an error");
  } catch (const ConfigError& e) {
    CHECK(e.key() == "parallelism");
    CHECK_THAT(e.what(),
               Catch::Contains("dp_replicate(2) * dp_shard(4) * cp(1) * tp(2) * pp(1) = 16 != WORLD_SIZE(8)"));
  }
  p.data_parallel_shard_degree = -1;
  CHECK_THROWS_WITH(dist::mesh_shape(p, 6), Catch::Contains("divisible"));
}

TEST_CASE("mesh groups hold the ranks that differ along one axis", "[dist][mesh]") {
  const dist::MeshShape shape{.dp_replicate = 2, .dp_shard = 2};
  dist::run_local_ranks(4, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(shape, rank, store, kFast);
    // Row-major, tp fastest: rank = dp_replicate * 2 + dp_shard.
    RANK_CHECK(mesh.coordinate("dp_replicate") == rank / 2);
    RANK_CHECK(mesh.coordinate("dp_shard") == rank % 2);
    RANK_CHECK(mesh.size("dp") == 4);
    RANK_CHECK(mesh.size("tp") == 1);
    const auto& shard_ranks = mesh.group("dp_shard").global_ranks();
    RANK_CHECK(shard_ranks == std::vector<int64_t>{rank / 2 * 2, rank / 2 * 2 + 1});
    at::Tensor t = at::full({3}, static_cast<double>(rank + 1), at::kFloat);
    mesh.group("dp_shard").all_reduce(t).wait();
    const double expected = rank < 2 ? 1 + 2 : 3 + 4;
    RANK_CHECK(t[0].item<double>() == expected);
    at::Tensor avg = at::full({2}, static_cast<double>(rank), at::kFloat);
    mesh.group("dp").all_reduce(avg, dist::ReduceOp::kAvg).wait();
    RANK_CHECK(avg[1].item<double>() == Approx(1.5));
    RANK_CHECK(mesh.group("dp").stats().all_reduce_bytes == 2 * 3 * 8 / 4);
  });
}

TEST_CASE("differentiable all_gather and reduce_scatter are each other's backward", "[dist][collectives]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 2}, rank, store, kFast);
    const dist::ProcessGroup& g = mesh.group("dp_shard");
    at::Tensor x = (at::arange(6, at::kFloat).view({2, 3}) + 10 * rank).requires_grad_(true);  // (2, 3)
    at::Tensor y = dist::all_gather(x, g, 1);                                                  // (2, 6)
    RANK_CHECK(y.sizes() == at::IntArrayRef({2, 6}));
    RANK_CHECK(at::equal(y.narrow(1, 3, 3), at::arange(6, at::kFloat).view({2, 3}) + 10));
    // Each rank weights the gathered tensor differently; x's gradient is the sum of both ranks'
    // weights on its columns.
    const at::Tensor w = at::full({2, 6}, static_cast<double>(rank + 1), at::kFloat);
    (y * w).sum().backward();
    RANK_CHECK(at::allclose(x.grad(), at::full({2, 3}, 3.0, at::kFloat)));

    at::Tensor z = at::ones({4, 2}, at::kFloat).mul(rank + 1).requires_grad_(true);  // (4, 2)
    at::Tensor s = dist::reduce_scatter(z, g, 0);                                    // (2, 2)
    RANK_CHECK(at::allclose(s, at::full({2, 2}, 3.0, at::kFloat)));
    (s * static_cast<double>(rank + 1)).sum().backward();
    // Backward all-gathers: rows of rank 0's chunk get weight 1, rank 1's chunk weight 2.
    RANK_CHECK(at::equal(z.grad().narrow(0, 0, 2), at::ones({2, 2})));
    RANK_CHECK(at::equal(z.grad().narrow(0, 2, 2), at::full({2, 2}, 2.0)));
  });
}

TEST_CASE("all_to_all exchanges chunks and copy_to_group all-reduces the gradient", "[dist][collectives]") {
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2}, rank, store, kFast);
    const dist::ProcessGroup& g = mesh.group("tp");
    // (4, 2): rows 0-1 go to rank 0, rows 2-3 to rank 1; received chunks concatenated on dim 1.
    at::Tensor x = (at::arange(8, at::kFloat).view({4, 2}) + 100 * rank).requires_grad_(true);
    at::Tensor y = dist::all_to_all(x, g, 0, 1);  // (2, 4)
    const at::Tensor base = at::arange(8, at::kFloat).view({4, 2}).narrow(0, 2 * rank, 2);
    RANK_CHECK(at::equal(y, at::cat({base, base + 100}, 1)));
    y.sum().backward();
    RANK_CHECK(at::equal(x.grad(), at::ones({4, 2})));

    at::Tensor a = at::ones({3}, at::kFloat).requires_grad_(true);
    (dist::copy_to_group(a, g) * static_cast<double>(rank + 1)).sum().backward();
    RANK_CHECK(at::equal(a.grad(), at::full({3}, 3.0)));
  });
}

TEST_CASE("a rank that joins with a wrong world size fails with a clear error", "[dist][mesh]") {
  CHECK_THROWS_WITH(
      dist::run_local_ranks(
          1, [&](int64_t rank, const dist::Store& store) { dist::Mesh mesh({.dp_shard = 2}, rank + 2, store, kFast); }),
      Catch::Contains("expected 0 <= RANK < 2"));
}
