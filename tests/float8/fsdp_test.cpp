// SPDX-License-Identifier: BSD-3-Clause
// float8 under FSDP (torchao's float8 all-gather): the debug model with tensorwise float8 Linears on
// FSDP 2 (ranks as threads, Gloo) against one device, with the weights all-gathered in float8, with and
// without precomputed scales, per parameter and flat. The wire is checked too, so a silent fall-back to high-precision
// gathers fails the test.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "../parallel/parity_check.hpp"
#include "titan/dist/local_ranks.hpp"

namespace {

using titan::test::ParityResult;
using titan::test::ParityRun;

constexpr int64_t kSteps = 6;
constexpr int64_t kFloat8Weights = 42;  // 6 blocks x (wq wk wv wo w1 w2 w3); output stays high precision

struct Fsdp2Run {
  std::vector<ParityResult> ranks;  // per rank
  titan::dist::CommStats shard;     // dp_shard traffic of rank 0
};

Fsdp2Run fsdp2(const ParityRun& run) {
  Fsdp2Run out;
  out.ranks.resize(2);
  std::mutex mutex;
  titan::dist::run_local_ranks(2, [&](int64_t rank, const titan::dist::Store& store) {
    const titan::dist::Mesh mesh(titan::dist::MeshShape{.dp_shard = 2}, rank, store, titan::test::kFast);
    mesh.group("dp_shard").reset_stats();
    ParityResult r = titan::test::train_parity(mesh, run);
    const titan::dist::CommStats stats = mesh.group("dp_shard").stats();
    std::lock_guard lock(mutex);
    out.ranks[static_cast<size_t>(rank)] = std::move(r);
    if (rank == 0) out.shard = stats;
  });
  return out;
}

}  // namespace

TEST_CASE(
    "float8 FSDP 2: all-gathering float8 weights gives the one-device float8 losses, with and without "
    "precomputed scales",
    "[parallel][fsdp][float8]") {
  const ParityRun one_run{.steps = kSteps, .float8 = true};
  const ParityResult one = titan::test::train_parity(titan::dist::Mesh(), one_run);
  ParityRun high = one_run;  // FSDP gathers fp32 weights; each Linear casts the gathered weight
  const Fsdp2Run hp = fsdp2(high);
  ParityRun f8 = one_run;
  f8.float8_all_gather = true;
  const Fsdp2Run gathered = fsdp2(f8);
  f8.float8_precompute = true;
  const Fsdp2Run precomputed = fsdp2(f8);
  f8.collectives = titan::parallel::DataParallelCollectives::flat;  // the GPU layout: float8 beside the flat buffer
  const Fsdp2Run flat = fsdp2(f8);

  double max_rel = 0;
  for (const Fsdp2Run* run : {&hp, &gathered, &precomputed, &flat}) {
    for (const ParityResult& r : run->ranks) {
      REQUIRE(r.losses.size() == one.losses.size());
      for (size_t s = 0; s < one.losses.size(); ++s) {
        INFO("step " << s + 1 << ": FSDP 2 " << r.losses[s] << ", one device " << one.losses[s]);
        const double rel = std::abs(r.losses[s] - one.losses[s]) / std::abs(one.losses[s]);
        max_rel = std::max(max_rel, rel);
        // The float8 bytes and scales are the one-device ones (the scale comes from the whole weight's
        // amax, and a cast is element-wise); FSDP only sums in another order (gradient reduce-scatter,
        // loss all-reduce): fp32 rounding, ~1e-7 relative, which the fp32 parity tests bound by 1e-5.
        // float8 magnifies it: after a step, the few weights and activations that now sit on the other
        // side of an e4m3 rounding boundary (3 mantissa bits) move by 1/16 of their value, and AdamW's
        // first steps (update ~ lr * sign(grad)) flip elements whose gradient is at rounding level.
        // Measured max 2.4e-5 relative over 6 steps (2026-12-01); the same holds for FSDP gathering fp32,
        // which this run equals bit for bit (below). 1e-4 leaves 4x; a wrong scale (per shard, stale)
        // moves the loss by ~1e-3.
        CHECK(rel <= 1e-4);
      }
    }
  }
  WARN("float8 FSDP 2 vs one device, max relative loss difference over " << kSteps << " steps: " << max_rel);
  // Gathering float8 bytes instead of casting the gathered fp32 weight is the same arithmetic: bitwise.
  for (size_t rank = 0; rank < 2; ++rank) {
    CHECK(gathered.ranks[rank].losses == hp.ranks[rank].losses);
    CHECK(precomputed.ranks[rank].losses == hp.ranks[rank].losses);
    CHECK(flat.ranks[rank].losses == hp.ranks[rank].losses);
  }
  CHECK(one.losses.back() < one.losses.front() - 0.3);  // it trains

  // The wire: float8 weights move 1 byte per element instead of 4. They are ~95% of the debug
  // model's elements, but the units gather unequally often (blocks in forward and again in backward,
  // the last units once), so the dp_shard all-gather bytes drop to 0.341 of the fp32 run's (measured
  // 2026-12-01; 0.25 if every gathered element were float8). A fall-back to fp32 gathers gives 1.
  const double ratio =
      static_cast<double>(gathered.shard.all_gather_bytes) / static_cast<double>(hp.shard.all_gather_bytes);
  WARN("float8 all-gather bytes / fp32 all-gather bytes on dp_shard: " << ratio);
  CHECK(ratio > 0.25);
  CHECK(ratio < 0.4);
  CHECK(precomputed.shard.all_gather_bytes == gathered.shard.all_gather_bytes);
  CHECK(flat.shard.all_gather_bytes == gathered.shard.all_gather_bytes);
  // Scales: precomputed, one all-reduce of 42 float32 amaxes per step (2(n-1)/n = 1 x 168 bytes) on
  // top of the fp32 run's all-reduces; otherwise one 4-byte all-reduce per float8 weight per gather
  // (forward, and backward's re-gather of resharded units): more bytes and many more calls.
  CHECK(precomputed.shard.all_reduce_bytes - hp.shard.all_reduce_bytes == kSteps * kFloat8Weights * 4);
  const int64_t per_gather = gathered.shard.all_reduce_bytes - hp.shard.all_reduce_bytes;
  CHECK(per_gather % 4 == 0);
  CHECK(per_gather / 4 >= kSteps * kFloat8Weights);  // at least one gather per weight per step
  CHECK(gathered.shard.calls - precomputed.shard.calls == per_gather / 4 - kSteps);
}
