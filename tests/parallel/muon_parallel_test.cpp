// SPDX-License-Identifier: BSD-3-Clause
// Muon on sharded matrices (ranks as threads, the strict backend: NCCL's rules enforced, so the owners' all-to-alls
// are shown to match on every rank) against Muon in one process, on the parity model (tests/parallel/parity_util.hpp).
//
// Same gradients: every rank gets its block of the same global gradients, two steps. The momentum and the update are
// element-wise on the blocks, the gather reassembles the whole bf16 update exactly, and the owner runs the one-process
// ops on it: the weights are expected bit for bit. The tolerance, 1e-5 absolute, allows a GEMM blocked otherwise on a
// rank thread (another thread count) to round one bf16 element of O the other way: one bf16 ulp of |O| < 1 is 2^-8,
// times lr 5e-4 x the largest lr ratio 2 is 3.9e-6 per step, 7.8e-6 over two. A block sent to the wrong owner, put in
// the wrong place or orthogonalised alone moves weights by lr x |O| ~ 5e-4 x 0.1, five times the tolerance and more.
//
// Checkpoints: momentum saved on FSDP 2 resumes on FSDP 2 bit for bit and on TP 2 like the uninterrupted run within
// the parity tolerances (parity_check.hpp: fp32 sums reordered; a bf16 element of O rounded the other way moves a
// weight by at most lr 1e-3 x ratio 2 x 2^-7 = 1.6e-5 per step, under kWeightAtol over the two resumed steps).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <mutex>

#include "dist/rank_test_util.hpp"
#include "parity_check.hpp"
#include "parity_util.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace muon_parallel_test {

using namespace titan;

namespace {

constexpr double kLr = 5e-4;
constexpr int64_t kSteps = 2;

// This rank's block of a global tensor: the region its layout names, dim 0 padded with zeros to the local shape.
at::Tensor local_block(const at::Tensor& global, const at::Tensor& p) {
  const parallel::ShardedParam* sp = parallel::sharded_param(p);
  if (sp == nullptr) return global.clone();
  at::Tensor region = global;
  for (size_t d = 0; d < sp->offset.size(); ++d) {
    region = region.narrow(static_cast<int64_t>(d), sp->offset[d], sp->local_shape[d]);
  }
  at::Tensor block = at::zeros(p.sizes(), p.options());
  block.narrow(0, 0, region.size(0)).copy_(region);
  return block;
}

struct SameGradients {
  std::vector<at::Tensor> weights;  // whole, per parameter
  std::vector<std::string> names;
  std::vector<bool> matrix;    // per parameter: stepped by Muon
  int64_t orthogonalised = 0;  // matrices this rank orthogonalised
};

// Two Muon steps on global gradients drawn from (step, parameter name): the same on every layout.
SameGradients step_same_gradients(const dist::Mesh& mesh) {
  test::ParityModel m = test::parity_model(mesh, {});
  Muon optimizer(m.params, {.name = OptimizerName::muon, .lr = kLr, .muon_lr = kLr}, m.names,
                 {.mesh = &mesh, .adamw_modules = m.embedding_and_head});
  for (int64_t step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    for (size_t i = 0; i < m.params.size(); ++i) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(
          static_cast<uint64_t>(std::hash<std::string>{}(m.names[i]) % 100000 + 100000 * static_cast<size_t>(step)));
      m.params[i].mutable_grad() = local_block(
          at::randn(parallel::sharded_param(m.params[i]) != nullptr ? parallel::sharded_param(m.params[i])->global_shape
                                                                    : m.params[i].sizes().vec(),
                    gen),
          m.params[i]);
    }
    optimizer.step(kLr);
  }
  SameGradients out{.weights = {}, .names = m.names, .matrix = {}, .orthogonalised = optimizer.orthogonalised_here()};
  for (size_t i = 0; i < m.params.size(); ++i) {
    out.weights.push_back(parallel::full_tensor(m.params[i], mesh));
    out.matrix.push_back(optimizer.is_matrix(i));
  }
  return out;
}

const SameGradients& one_process() {
  static const SameGradients result = step_same_gradients(dist::Mesh());
  return result;
}

void check_same_gradients(const dist::MeshShape& shape) {
  const SameGradients& ref = one_process();
  std::mutex mutex;
  std::vector<SameGradients> results(static_cast<size_t>(shape.world_size()));
  dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(shape, rank, store, test::kFast);
    SameGradients r = step_same_gradients(mesh);
    std::lock_guard lock(mutex);
    results[static_cast<size_t>(rank)] = std::move(r);
  });
  const int64_t matrices = std::count(ref.matrix.begin(), ref.matrix.end(), true);
  CHECK(matrices == 6 * 7);  // wq wk wv wo w1 w2 w3 of each block; embeddings, head and norms are AdamW's
  int64_t owned = 0, most = 0, least = matrices;
  for (size_t rank = 0; rank < results.size(); ++rank) {
    const SameGradients& r = results[rank];
    INFO(fmt::format("{} rank {}", shape, rank));
    REQUIRE(r.names == ref.names);
    CHECK(r.matrix == ref.matrix);
    for (size_t i = 0; i < r.weights.size(); ++i) {
      const double diff = (r.weights[i] - ref.weights[i]).abs().max().item<double>();
      INFO(fmt::format("{} max |diff| {:.3g}", r.names[i], diff));
      CHECK(diff <= 1e-5);
    }
    owned += r.orthogonalised;
    most = std::max(most, r.orthogonalised);
    least = std::min(least, r.orthogonalised);
  }
  // Every matrix is sharded over all ranks here: one owner each, as many per rank as round-robin gives.
  CHECK(owned == matrices);
  CHECK(most - least <= 1);
}

}  // namespace

TEST_CASE("Muon on FSDP 2 steps the shards to the one-process weights", "[parallel][muon][fsdp]") {
  check_same_gradients({.dp_shard = 2});
}

TEST_CASE("Muon on TP 2 (colwise and rowwise shards) steps to the one-process weights", "[parallel][muon][tp]") {
  check_same_gradients({.tp = 2});
}

TEST_CASE("Muon on FSDP 2 x TP 2 gathers each matrix over both axes to one owner", "[parallel][muon][fsdp][tp]") {
  check_same_gradients({.dp_shard = 2, .tp = 2});
}

TEST_CASE("Muon state saved on FSDP 2 resumes on FSDP 2 bitwise and on TP 2 like the uninterrupted run",
          "[parallel][muon][checkpoint]") {
  const test::ParityRun muon{.steps = 4, .optimizer = OptimizerName::muon};
  const auto on_threads = [](const dist::MeshShape& shape, const test::ParityRun& run) {
    std::mutex mutex;
    test::ParityResult rank0;
    dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
      const dist::Mesh mesh(shape, rank, store, test::kFast);
      test::ParityResult r = test::train_parity(mesh, run);
      std::lock_guard lock(mutex);
      if (rank == 0) rank0 = std::move(r);
    });
    return rank0;
  };
  test::TempDir dir;
  const std::string saved = (dir.path / "step-2").string();
  const test::ParityResult straight = on_threads({.dp_shard = 2}, muon);
  test::ParityRun first = muon;
  first.steps = 2;
  first.save = saved;
  on_threads({.dp_shard = 2}, first);
  test::ParityRun rest = muon;
  rest.first_step = 2;
  rest.load = saved;
  const test::ParityResult same_layout = on_threads({.dp_shard = 2}, rest);
  const test::ParityResult other_layout = on_threads({.tp = 2}, rest);
  REQUIRE(straight.losses.size() == 4);
  for (const auto* resumed : {&same_layout, &other_layout}) {
    REQUIRE(resumed->losses.size() == 2);
    REQUIRE(resumed->names == straight.names);
  }
  for (size_t s = 0; s < 2; ++s) {
    INFO("step " << s + 3);
    CHECK(same_layout.losses[s] == straight.losses[s + 2]);
    CHECK(other_layout.losses[s] == Approx(straight.losses[s + 2]).epsilon(1e-5));
  }
  for (size_t i = 0; i < straight.weights.size(); ++i) {
    INFO(straight.names[i] << " max |diff| on TP 2 "
                           << (other_layout.weights[i] - straight.weights[i]).abs().max().item<double>());
    CHECK(at::equal(same_layout.weights[i], straight.weights[i]));
    CHECK(at::allclose(other_layout.weights[i], straight.weights[i], 1e-4, test::kWeightAtol));
  }
}

}  // namespace muon_parallel_test
