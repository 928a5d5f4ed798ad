// SPDX-License-Identifier: BSD-3-Clause
// at::mm in bf16 against fp32 on this CPU: GFLOP/s of square GEMMs (2 n^3 FLOPs each, median time)
// for the sizes given. It answers whether bf16 mixed precision speeds up compute on a CPU (one with
// AVX512-BF16/AMX should show several times fp32; one without may show bf16 slower, converted in
// software). The widened column is titan's bf16 GEMM where the CPU lacks AMX (nn/bf16_gemm.hpp): the bf16
// operands converted to fp32, an fp32 GEMM, the product rounded to bf16, conversions included. Run:
//   OMP_NUM_THREADS=2 build/bin/bench_mm_dtype --sizes 256,512,1024,2048 --iters 10
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "bench_flags.hpp"
#include "bench_timing.hpp"
#include "titan/nn/bf16_gemm.hpp"

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {256, 512, 1024, 2048};
  int64_t iters = 10;
  titan::bench::parse_flags(argc, argv, "bench_mm_dtype", {{"--sizes", &sizes}, {"--iters", &iters}});
  fmt::print("at::mm (n, n) x (n, n), {} threads, median of {}; GFLOP/s = 2 n^3 / time\n", at::get_num_threads(),
             iters);
  fmt::print(
      "| n | fp32 GFLOP/s | bf16 GFLOP/s | bf16 widened GFLOP/s | bf16 / fp32 | widened / bf16 |\n"
      "|---:|---:|---:|---:|---:|---:|\n");
  const at::NoGradGuard no_grad;
  const auto aten = [](const at::Tensor& a, const at::Tensor& b) { return at::mm(a, b); };
  for (const int64_t n : sizes) {
    const at::Tensor a = at::randn({n, n});  // (n, n)
    const at::Tensor b = at::randn({n, n});  // (n, n)
    const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    const at::Tensor a16 = a.to(at::kBFloat16);  // (n, n)
    const at::Tensor b16 = b.to(at::kBFloat16);  // (n, n)
    const double fp32 = flops / titan::bench::median_seconds(iters, [&] { (void)aten(a, b); }) / 1e9;
    const double bf16 = flops / titan::bench::median_seconds(iters, [&] { (void)aten(a16, b16); }) / 1e9;
    const double widened =
        flops / titan::bench::median_seconds(iters, [&] { (void)titan::nn::widened_mm(a16, b16); }) / 1e9;
    fmt::print("| {} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.2f} |\n", n, fp32, bf16, widened, bf16 / fp32,
               widened / bf16);
  }
  return 0;
}
