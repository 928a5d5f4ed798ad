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
#include <optional>

#include "../parallel/parity_check.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/float8/linear.hpp"

TEST_CASE("float8 TP 2: whole-tensor scales give the one-device float8 losses", "[parallel][tp][float8][full]") {
  const titan::test::ParityRun run{.steps = 8, .float8 = true};
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
      // 6 steps (2026-12-01); 1e-4 leaves 6x. Shard-local scales give about the same loss difference on
      // this model (1.3e-5 measured): the next test tells the two scalings apart on one Linear.
      CHECK(rel <= 1e-4);
    }
  }
  WARN("float8 TP 2 vs one device, max relative loss difference over " << one.losses.size() << " steps: " << max_rel);
  CHECK(results[0].losses == results[1].losses);  // the loss is all-reduced: every rank reports the same
  // That the parity job trains is shown once, over more steps (tests/parallel/parity_trains_test.cpp).
}

namespace {

// One tensorwise float8 Linear on TP 2, colwise (weight rows sharded) and rowwise (weight columns and
// the input's last dim sharded), with or without whole-tensor scales. One shard of the sharded operand
// is 1e-4 of the other's size, so a shard-local amax gives that shard a scale ~1e4 finer than the whole
// tensor's: its float8 bytes, and so its output, differ from one device's by far more than rounding.
struct ShardedLinearDiff {
  double colwise_out = 0;  // max |y shard - one device's y columns| / max |y|
  double colwise_dw = 0;   // the same for the weight-gradient shard
  double rowwise_out = 0;  // max |sum of partial y - one device's y| / max |y|
  double rowwise_dw = 0;   // the weight-gradient shard against one device's columns
};

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

ShardedLinearDiff sharded_float8_linear(bool whole_tensor_scales) {
  at::manual_seed(7);
  const at::Tensor x = at::randn({8, 64});                                                // (T, K)
  const at::Tensor w = at::randn({32, 64});                                               // (N, K)
  const at::Tensor gy = at::randn({8, 32});                                               // (T, N)
  const at::Tensor tiny_rows = at::cat({at::ones({16, 1}), at::full({16, 1}, 1e-4)});     // (N, 1)
  const at::Tensor tiny_cols = at::cat({at::ones({1, 32}), at::full({1, 32}, 1e-4)}, 1);  // (1, K)
  const titan::float8::Float8LinearConfig config{};
  // One device: colwise case (small rows of w), rowwise case (small columns of x and w).
  const auto one_device = [&](const at::Tensor& xi, const at::Tensor& wi) {
    const at::Tensor wl = wi.clone().requires_grad_(true);
    const at::Tensor y = titan::float8::float8_linear(xi, wl, config);  // (T, N)
    y.backward(gy);
    return std::pair{y.detach(), wl.grad()};
  };
  const auto [y_col, dw_col] = one_device(x, w * tiny_rows);
  const auto [y_row, dw_row] = one_device(x * tiny_cols, w * tiny_cols);
  ShardedLinearDiff out;
  std::mutex mutex;
  titan::dist::run_local_ranks(2, [&](int64_t rank, const titan::dist::Store& store) {
    const titan::dist::Mesh mesh(titan::dist::MeshShape{.tp = 2}, rank, store, titan::test::kFast);
    const titan::parallel::WeightUse use{.tp_group = whole_tensor_scales ? &mesh.group("tp") : nullptr};
    // Colwise: this rank's 16 output features; the full input.
    const at::Tensor w_col = (w * tiny_rows).narrow(0, 16 * rank, 16).clone().requires_grad_(true);  // (16, 64)
    const at::Tensor y_c = titan::float8::float8_linear(x, w_col, config, use);                      // (8, 16)
    y_c.backward(gy.narrow(1, 16 * rank, 16));
    // Rowwise: this rank's 32 input features; partial outputs summed over tp.
    const at::Tensor x_r = (x * tiny_cols).narrow(1, 32 * rank, 32);                                 // (8, 32)
    const at::Tensor w_row = (w * tiny_cols).narrow(1, 32 * rank, 32).clone().requires_grad_(true);  // (32, 32)
    at::Tensor y_r = titan::float8::float8_linear(x_r, w_row, config, use);                          // (8, 32)
    y_r.backward(gy);
    at::Tensor y_sum = y_r.detach().clone();
    mesh.group("tp").all_reduce(y_sum).wait();
    std::lock_guard lock(mutex);
    out.colwise_out = std::max(out.colwise_out, rel_diff(y_c.detach(), y_col.narrow(1, 16 * rank, 16)));
    out.colwise_dw = std::max(out.colwise_dw, rel_diff(w_col.grad(), dw_col.narrow(0, 16 * rank, 16)));
    out.rowwise_out = std::max(out.rowwise_out, rel_diff(y_sum, y_row));
    out.rowwise_dw = std::max(out.rowwise_dw, rel_diff(w_row.grad(), dw_row.narrow(1, 32 * rank, 32)));
  });
  return out;
}

}  // namespace

TEST_CASE("float8 TP 2: a sharded Linear casts with the whole tensor's scale and not its shard's",
          "[parallel][tp][float8]") {
  const ShardedLinearDiff whole = sharded_float8_linear(true);
  const ShardedLinearDiff local = sharded_float8_linear(false);
  WARN("whole-tensor scales: colwise y " << whole.colwise_out << " dW " << whole.colwise_dw << ", rowwise y "
                                         << whole.rowwise_out << " dW " << whole.rowwise_dw
                                         << "; shard-local scales: colwise y " << local.colwise_out << " dW "
                                         << local.colwise_dw << ", rowwise y " << local.rowwise_out << " dW "
                                         << local.rowwise_dw);
  // Whole-tensor scales: the shards hold one device's float8 bytes and scales; colwise outputs are the
  // same dot products, the rowwise sum splits K in two (fp32 reordering, ~1e-7 of max |y|).
  // Measured (2026-12-01): 0, 0, 1.5e-8, 0.
  CHECK(whole.colwise_out <= 1e-6);
  CHECK(whole.colwise_dw <= 1e-6);
  CHECK(whole.rowwise_out <= 1e-5);
  CHECK(whole.rowwise_dw <= 1e-6);
  // Shard-local scales re-quantize the small shard far more finely: the control the checks above need.
  // (The rowwise output cannot show it: the small shard adds 1e-8 of y; its weight gradient does.)
  CHECK(local.colwise_out > 1e-3);
  CHECK(local.rowwise_dw > 1e-3);
}
