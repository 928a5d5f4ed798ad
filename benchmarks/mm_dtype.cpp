// SPDX-License-Identifier: BSD-3-Clause
// at::mm in bf16 against fp32 on this CPU: GFLOP/s of square GEMMs (2 n^3 FLOPs each, median time)
// for the sizes given. It answers whether bf16 mixed precision speeds up compute on a CPU (one with
// AVX512-BF16/AMX should show several times fp32; one without may show bf16 slower, converted in
// software). Run:
//   OMP_NUM_THREADS=2 build/bin/bench_mm_dtype --sizes 256,512,1024,2048 --iters 10
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench_flags.hpp"

namespace {

using Clock = std::chrono::steady_clock;

/// Median seconds of `iters` at::mm(a, b) after one warm-up.
double median_mm_seconds(const at::Tensor& a, const at::Tensor& b, int64_t iters) {
  at::Tensor out = at::mm(a, b);
  std::vector<double> times;
  for (int64_t i = 0; i < iters; ++i) {
    const auto start = Clock::now();
    at::mm_out(out, a, b);
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {256, 512, 1024, 2048};
  int64_t iters = 10;
  titan::bench::parse_flags(argc, argv, "bench_mm_dtype", {{"--sizes", &sizes}, {"--iters", &iters}});
  fmt::print("at::mm (n, n) x (n, n), {} threads, median of {}; GFLOP/s = 2 n^3 / time\n", at::get_num_threads(),
             iters);
  fmt::print("| n | fp32 GFLOP/s | bf16 GFLOP/s | bf16 / fp32 |\n|---:|---:|---:|---:|\n");
  for (const int64_t n : sizes) {
    const at::Tensor a = at::randn({n, n});  // (n, n)
    const at::Tensor b = at::randn({n, n});  // (n, n)
    const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    const double fp32 = flops / median_mm_seconds(a, b, iters) / 1e9;
    const double bf16 = flops / median_mm_seconds(a.to(at::kBFloat16), b.to(at::kBFloat16), iters) / 1e9;
    fmt::print("| {} | {:.1f} | {:.1f} | {:.2f} |\n", n, fp32, bf16, bf16 / fp32);
  }
  return 0;
}
