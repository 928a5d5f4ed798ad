// SPDX-License-Identifier: BSD-3-Clause
// float8 under tensor parallelism (torchao's Float8ColwiseParallel / Float8RowwiseParallel scaling):
// the debug model with tensorwise float8 Linears on TP 2 with sequence parallel and loss parallel
// (ranks as threads, Gloo) against one device. Every float8 operand of a sharded Linear is scaled by
// the amax of the whole tensor (all-reduced over tp), so each rank casts the bytes one device casts.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "../parallel/parity_check.hpp"
#include "titan/dist/local_ranks.hpp"

TEST_CASE("float8 TP 2: whole-tensor scales give the one-device float8 losses", "[parallel][tp][float8]") {
  const titan::test::ParityRun run{.steps = 6, .float8 = true};
  const titan::test::ParityResult one = titan::test::train_parity(titan::dist::Mesh(), run);
  std::mutex mutex;
  std::vector<titan::test::ParityResult> results(2);
  titan::dist::run_local_ranks(2, [&](int64_t rank, const titan::dist::Store& store) {
    const titan::dist::Mesh mesh(titan::dist::MeshShape{.tp = 2}, rank, store, titan::test::kFast);
    titan::test::ParityResult r = titan::test::train_parity(mesh, run);
    std::lock_guard lock(mutex);
    results[static_cast<size_t>(rank)] = std::move(r);
  });
  double max_rel = 0;
  for (const titan::test::ParityResult& r : results) {
    REQUIRE(r.losses.size() == one.losses.size());
    for (size_t s = 0; s < one.losses.size(); ++s) {
      INFO("step " << s + 1 << ": TP 2 " << r.losses[s] << ", one device " << one.losses[s]);
      const double rel = std::abs(r.losses[s] - one.losses[s]) / std::abs(one.losses[s]);
      max_rel = std::max(max_rel, rel);
      // Same float8 bytes and scales as one device; what differs is where fp32 sums are split: a
      // row-parallel GEMM's partial sums added by the reduce-scatter, the loss over vocab shards, and
      // the sequence-parallel norm-weight gradients (~1e-7 relative per sum, bounded by 1e-5 in the
      // fp32 TP parity test). float8 magnifies that as under FSDP (fsdp_test.cpp): values that land
      // on the other side of an e4m3 rounding boundary move by 1/16. Measured max 1.6e-5 relative over
      // 6 steps (2026-12-01); 1e-4 leaves 6x. NOTE: a control run with WholeTensorScales disabled
      // (per-shard scales) measured 1.3e-5: the losses do not tell the two scalings apart at this size.
      CHECK(rel <= 1e-4);
    }
  }
  WARN("float8 TP 2 vs one device, max relative loss difference over " << one.losses.size() << " steps: " << max_rel);
  CHECK(results[0].losses == results[1].losses);  // the loss is all-reduced: every rank reports the same
  CHECK(one.losses.back() < one.losses.front() - 0.3);
}
