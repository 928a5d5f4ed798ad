// SPDX-License-Identifier: BSD-3-Clause
// Parallel layouts (FSDP, HSDP, DDP, TP, 2-D) against one rank: same seed (layout-invariant init),
// same global batches, 8 steps of the parity model (parity_args) with ranks as threads (a sharding error
// shows at step 1-2; 8 steps cover AdamW's first moments and warm state). The meshes use the strict
// backend: Gloo with NCCL's rules enforced (point-to-point in posting order, the same collectives on every
// rank; tests/dist/nccl_rules_test.cpp), so each layout is also shown not to hang under NCCL.
// Tolerance: fp32 sums are reordered (each rank sums its tokens, the collective sums ranks), ~1e-7 relative per
// reduction, which AdamW's division by sqrt(v) amplifies on elements whose gradient is near rounding level (their
// update is lr * m / sqrt(v), whatever the gradient's size). We require 1e-5 relative on losses and grad norms and, on
// the final weights, 1e-4 relative plus 5e-5 absolute (kWeightAtol: 5% of one step's lr). The absolute part is set by
// the elements whose gradient is near rounding level: AdamW moves them by up to lr per step in a direction the rounding
// picks, and how a CPU's GEMM kernels round (AVX2 vs AVX-512 blocking) changes which elements those are. Measured max:
// 3e-6 for FSDP 2, 1.2e-5 for HSDP 2x2 (two reductions) on an AVX2 AMD EPYC; 2.5e-5 for CP 2 with documents on an
// AVX-512 Intel Xeon. A sharding error shows far above it: in the losses and grad norms (1e-5 relative) from the step
// it happens. TP adds the same kind of reordering (row-parallel partial sums are added by the all-reduce), so it gets
// the same tolerances.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "dist/rank_test_util.hpp"
#include "parity_util.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"

namespace titan::test {

/// The final weights' absolute tolerance: 5% of one AdamW step's largest move (lr).
inline constexpr double kWeightAtol = 0.05 * kParityLr;

inline const dist::MeshOptions kFast = mesh_options(std::chrono::seconds(120));

inline const ParityResult& single_rank() {
  static const ParityResult result = train_parity(dist::Mesh(), {});
  return result;
}

inline void check_parity(const dist::MeshShape& shape, const ParityRun& run = {}) {
  // Another global batch (one divisible by an odd rank count) or documents need their own one-rank run.
  const bool default_batch = run.global_batch == ParityRun{}.global_batch && !run.documents;
  const ParityResult other =
      default_batch ? ParityResult{}
                    : train_parity(dist::Mesh(), {.global_batch = run.global_batch, .documents = run.documents});
  const ParityResult& ref = default_batch ? single_rank() : other;
  std::mutex mutex;
  std::vector<ParityResult> results(static_cast<size_t>(shape.world_size()));
  dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(shape, rank, store, kFast);
    ParityResult r = train_parity(mesh, run);
    std::lock_guard lock(mutex);
    results[static_cast<size_t>(rank)] = std::move(r);
  });
  for (size_t rank = 0; rank < results.size(); ++rank) {
    const auto& r = results[rank];
    INFO(fmt::format("{} rank {}", shape, rank));
    REQUIRE(r.losses.size() == ref.losses.size());
    for (size_t s = 0; s < r.losses.size(); ++s) {
      INFO("step " << s + 1 << " loss " << r.losses[s] << " vs " << ref.losses[s]);
      CHECK(r.losses[s] == Approx(ref.losses[s]).epsilon(1e-5));
      CHECK(r.grad_norms[s] == Approx(ref.grad_norms[s]).epsilon(1e-5));
    }
    // A pipeline rank holds its stages' parameters only: compare those by name.
    REQUIRE(!r.weights.empty());
    REQUIRE(r.names.size() == r.weights.size());
    for (size_t i = 0; i < r.weights.size(); ++i) {
      const auto it = std::find(ref.names.begin(), ref.names.end(), r.names[i]);
      REQUIRE(it != ref.names.end());
      const at::Tensor& expected = ref.weights[static_cast<size_t>(it - ref.names.begin())];
      INFO("parameter " << r.names[i] << " max abs diff " << (r.weights[i] - expected).abs().max().item<double>());
      CHECK(at::allclose(r.weights[i], expected, 1e-4, kWeightAtol));
    }
  }
  // That the reference trains is shown once for the job, over more steps than these 8, whose fall stays within
  // the batch noise (tests/parallel/parity_trains_test.cpp).
}

/// A model's training as one rank sees it: each step's loss and grad norm, and the whole weights at the end by name.
struct NamedRun {
  std::vector<double> losses{};
  std::vector<double> grad_norms{};
  std::map<std::string, at::Tensor> weights{};
};

/// Trains with `train` on every rank of `shape` (threads, the strict backend) and checks each rank against `ref`, the
/// one process's run: losses and grad norms to 1e-5 relative, every whole weight (a pipeline rank: its stages') to
/// 1e-5 absolute and relative (the argument: tests/parallel/user_model_parity_test.cpp). Returns each rank's run.
inline std::vector<NamedRun> check_named_ranks(const dist::MeshShape& shape, const NamedRun& ref,
                                               const std::function<NamedRun(const dist::Mesh&)>& train) {
  std::mutex mutex;
  std::vector<NamedRun> results(static_cast<size_t>(shape.world_size()));
  dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(shape, rank, store, kFast);
    NamedRun r = train(mesh);
    std::lock_guard lock(mutex);
    results[static_cast<size_t>(rank)] = std::move(r);
  });
  std::set<std::string> held;  // the weights some rank holds
  for (size_t rank = 0; rank < results.size(); ++rank) {
    const NamedRun& r = results[rank];
    INFO(fmt::format("{} rank {}", shape, rank));
    REQUIRE(r.losses.size() == ref.losses.size());
    for (size_t s = 0; s < ref.losses.size(); ++s) {
      INFO("step " << s + 1 << " loss " << r.losses[s] << " vs " << ref.losses[s]);
      CHECK(r.losses[s] == Approx(ref.losses[s]).epsilon(1e-5));
      CHECK(r.grad_norms[s] == Approx(ref.grad_norms[s]).epsilon(1e-5));
    }
    // A pipeline rank holds its stages' weights only; together the ranks hold every one.
    if (shape.pp == 1) REQUIRE(r.weights.size() == ref.weights.size());
    for (const auto& [name, got] : r.weights) {
      REQUIRE(ref.weights.contains(name));
      const at::Tensor& expected = ref.weights.at(name);
      INFO(name << " max abs diff " << (got - expected).abs().max().item<double>());
      CHECK(at::allclose(got, expected, 1e-5, 1e-5));
      held.insert(name);
    }
  }
  CHECK(held.size() == ref.weights.size());
  return results;
}

/// check_named_ranks against `train` in one process; and that the one process trained (its loss fell).
inline void check_named_runs(const dist::MeshShape& shape, const std::function<NamedRun(const dist::Mesh&)>& train) {
  const NamedRun ref = train(dist::Mesh());
  check_named_ranks(shape, ref, train);
  CHECK(ref.losses.back() < ref.losses.front() - 0.05);  // it trained
}

}  // namespace titan::test
