// SPDX-License-Identifier: BSD-3-Clause
// float8 cast kernels on CPU: GB/s of titan's fused casts (widest build and the portable one) next to
// their ATen reference (torchao's eager op sequence) and a plain copy of the same tensor (the memory
// bandwidth ceiling a cast could reach: x copied into a buffer allocated once). GB/s counts the bytes a
// cast must move at least: the input read once and the float8 output written once (each cast allocates
// its output, as in training); for the "values" rows (float8::cast_values) the output is float32. Run:
//   OMP_NUM_THREADS=2 build/bin/bench_float8_cast --rows 4096 --cols 4096 --iters 20
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "bench_flags.hpp"
#include "bench_timing.hpp"
#include "titan/float8/cast.hpp"
#include "titan/float8/detail/cpu_cast.hpp"

namespace {

namespace f8 = titan::float8;
using titan::bench::median_seconds;

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 4096;
  int64_t cols = 4096;
  int64_t iters = 20;
  titan::bench::parse_flags(argc, argv, "bench_float8_cast",
                            {{"--rows", &rows}, {"--cols", &cols}, {"--iters", &iters}});
  const auto builds = f8::detail::cpu_kernel_builds();
  fmt::print(
      "float8 cast, x ({}, {}), {} threads, kernel builds: {}; GB/s = (input bytes + output bytes) / median time\n",
      rows, cols, at::get_num_threads(), fmt::join(builds, ", "));
  fmt::print("| source | cast | copy x (ceiling) | titan {} | titan default | ATen reference |\n", builds.front());
  fmt::print("|---|---|---:|---:|---:|---:|\n");
  for (auto source : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = at::randn({rows, cols}).to(source);
    const double in_bytes = static_cast<double>(x.nbytes());
    const double out_bytes = static_cast<double>(x.numel());
    at::Tensor copy = at::empty_like(x);
    const double copy_s = median_seconds(iters, [&] { copy.copy_(x); });
    struct Case {
      const char* name;
      f8::CastSpec spec;
      bool transposed;
    };
    const std::vector<Case> cases = {
        {"tensorwise e4m3", {.dtype = at::kFloat8_e4m3fn}, false},
        {"rowwise e4m3 pow2", {.scaling = f8::Scaling::kRowwise, .power_of_2_scales = true}, false},
        {"tensorwise e5m2, transposed", {.dtype = at::kFloat8_e5m2}, true},
        {"rowwise e4m3, transposed", {.scaling = f8::Scaling::kRowwise, .power_of_2_scales = true}, true},
    };
    for (const Case& c : cases) {
      auto gbps = [&](double seconds) { return (in_bytes + out_bytes) / seconds / 1e9; };
      const double widest =
          median_seconds(iters, [&] { (void)f8::detail::cpu_cast(x, c.spec, c.transposed, builds.front()); });
      const double portable =
          median_seconds(iters, [&] { (void)f8::detail::cpu_cast(x, c.spec, c.transposed, "default"); });
      const double reference = median_seconds(iters, [&] {
        (void)(c.transposed ? f8::reference::cast_transposed(x, c.spec) : f8::reference::cast(x, c.spec));
      });
      fmt::print("| {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |\n", c10::toString(source), c.name,
                 (2 * in_bytes) / copy_s / 1e9, gbps(widest), gbps(portable), gbps(reference));
    }
    // cast_values: the float32 operand of a CPU float8 GEMM straight from x; its output is 4 bytes a value.
    for (bool transposed : {false, true}) {
      const f8::CastSpec spec{.dtype = transposed ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn};
      auto gbps = [&](double seconds) { return (in_bytes + 4 * out_bytes) / seconds / 1e9; };
      const double widest =
          median_seconds(iters, [&] { (void)f8::detail::cpu_cast_values(x, spec, transposed, builds.front()); });
      const double portable =
          median_seconds(iters, [&] { (void)f8::detail::cpu_cast_values(x, spec, transposed, "default"); });
      const double reference = median_seconds(iters, [&] { (void)f8::reference::cast_values(x, spec, transposed); });
      fmt::print("| {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |\n", c10::toString(source),
                 transposed ? "values e5m2, transposed" : "values e4m3", (2 * in_bytes) / copy_s / 1e9, gbps(widest),
                 gbps(portable), gbps(reference));
    }
  }
  return 0;
}
