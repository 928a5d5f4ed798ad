// SPDX-License-Identifier: BSD-3-Clause
// titan's CPU float8 cast kernels against their ATen reference: bytes and scales equal, for every
// build this CPU runs (default, avx2), source dtype, float8 dtype, scaling, transposition and shapes
// with vector tails and partial tiles.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>

#include "test_util.hpp"
#include "titan/float8/cast.hpp"
#include "titan/float8/detail/cpu_cast.hpp"

namespace f8 = titan::float8;

namespace {

/// Values over many binades (so small ones land in float8's subnormals), signed zeros, exact zeros.
at::Tensor spread(int64_t rows, int64_t cols, at::ScalarType dtype, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor x = at::randn({rows, cols}, gen) * at::exp(at::randn({rows, cols}, gen) * 3.0);
  const at::Tensor position = at::arange(rows * cols).view({rows, cols});
  x.masked_fill_(position % 7 == 0, 0.0);
  x.masked_fill_(position % 11 == 3, -0.0);
  return x.to(dtype);
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && at::equal(a.reshape(-1).view(at::kByte), b.reshape(-1).view(at::kByte));
}

}  // namespace

TEST_CASE("float8 cast: CPU kernels equal the ATen reference bit for bit", "[float8][cpu]") {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {3, 17}, {16, 64}, {65, 130}, {200, 33}, {2, 4099}};
  for (const std::string& build : f8::detail::cpu_kernel_builds()) {
    for (auto source : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (auto target : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
        for (auto scaling : {f8::Scaling::kTensorwise, f8::Scaling::kRowwise}) {
          for (bool pow2 : {false, true}) {
            for (bool transposed : {false, true}) {
              for (const auto& [R, C] : shapes) {
                const f8::CastSpec spec{.dtype = target, .scaling = scaling, .power_of_2_scales = pow2};
                const at::Tensor x = spread(R, C, source, static_cast<uint64_t>(R * 1000 + C));
                const auto got = f8::detail::cpu_cast(x, spec, transposed, build);
                const auto want = transposed ? f8::reference::cast_transposed(x, spec) : f8::reference::cast(x, spec);
                INFO(build << " " << c10::toString(source) << " -> " << c10::toString(target)
                           << (scaling == f8::Scaling::kRowwise ? " rowwise" : " tensorwise") << (pow2 ? " pow2" : "")
                           << (transposed ? " transposed" : "") << " (" << R << ", " << C << ")");
                REQUIRE(got.data.scalar_type() == target);
                REQUIRE(same_bytes(got.scale, want.scale));
                REQUIRE(same_bytes(got.data, want.data));
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("float8 to_float: the table widening equals ATen's conversion bit for bit, layout kept", "[float8][cpu]") {
  for (const auto dtype : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
    INFO(c10::toString(dtype));
    // Every byte, NaNs and infinities included, in a shape larger than one parallel chunk.
    const at::Tensor bytes = at::arange(256, at::kInt).repeat({600}).to(at::kByte).reshape({400, 384});  // (400, 384)
    const at::Tensor data = bytes.view(dtype);
    const at::Tensor want = data.to(at::kFloat);
    const at::Tensor got = titan::float8::to_float(data);
    CHECK(got.sizes() == want.sizes());
    CHECK(at::equal(got.view(at::kInt), want.view(at::kInt)));
    // A column-major view widens column-major, as .to() keeps it.
    const at::Tensor t = titan::float8::to_float(data.t());
    CHECK(t.strides() == data.t().to(at::kFloat).strides());
    CHECK(at::equal(t.view(at::kInt), data.t().to(at::kFloat).view(at::kInt)));
  }
  CHECK_THAT(titan::test::error_of([] { (void)titan::float8::to_float(at::ones({2})); }),
             Catch::Contains("expected float8 data"));
}

TEST_CASE("float8 cast: tensorwise casts keep any shape and an all-zero tensor gets torchao's scale", "[float8][cpu]") {
  const f8::CastSpec spec{};
  const at::Tensor x = at::randn({2, 3, 40});
  const auto got = f8::cast(x, spec);
  const auto want = f8::reference::cast(x, spec);
  CHECK(got.data.sizes() == x.sizes());
  CHECK(same_bytes(got.data, want.data));
  CHECK(got.scale.dim() == 0);
  // amax is clamped to 1e-12: scale = 448 / 1e-12 in float64, rounded to float32; the data are zeros.
  const auto zero = f8::cast(at::zeros({4, 32}), spec);
  CHECK(zero.scale.item<float>() == static_cast<float>((1.0 / 1e-12) * 448.0));
  CHECK(at::equal(zero.data.view(at::kByte), at::zeros({4, 32}, at::kByte)));
}

TEST_CASE("float8 cast: scales map each amax to the float8 max and dequantize within half a step", "[float8][cpu]") {
  const at::Tensor x = at::randn({32, 256}) * 5.0;
  for (auto target : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
    const auto q = f8::cast(x, {.dtype = target, .scaling = f8::Scaling::kRowwise});
    const at::Tensor amax = x.abs().amax({1}, true);
    CHECK(at::allclose(amax * q.scale, at::full_like(amax, f8::float8_max(target)), 1e-6, 0.0));
    // Relative error of a normal float8 value is at most half an ulp: 2^-4 (e4m3) or 2^-3 (e5m2).
    const double half_ulp = target == at::kFloat8_e4m3fn ? 1.0 / 16 : 1.0 / 8;
    const at::Tensor err = (q.dequantize() - x).abs();
    CHECK((err <= x.abs() * half_ulp + 1e-3).all().item<bool>());
  }
}

TEST_CASE("float8 cast: power-of-2 scales round down exactly, also just below a power of 2", "[float8][cpu]") {
  // amax chosen so that 448 / amax lies one float32 ulp below 16: floor is 8. (torchao's
  // exp2(floor(log2(s))) in float32 gives 16 here, since log2 rounds up to 4; see docs/float8.md.)
  const float below16 = std::nextafter(16.0f, 0.0f);
  const at::Tensor x = at::full({1, 16}, static_cast<float>(448.0 / below16));
  const auto spec = f8::CastSpec{.scaling = f8::Scaling::kRowwise, .power_of_2_scales = true};
  const float raw = f8::amax_to_scale(x.abs().amax({1}, true), {.dtype = at::kFloat8_e4m3fn}).item<float>();
  CHECK(raw < 16.0f);
  CHECK(f8::cast(x, spec).scale.item<float>() == 8.0f);
  CHECK(f8::reference::cast(x, spec).scale.item<float>() == 8.0f);
}

TEST_CASE("float8 cast: NaN in gives NaN out, and bad input is refused with the reason", "[float8][cpu]") {
  at::Tensor x = at::randn({8, 32});
  x[3][5] = std::numeric_limits<float>::quiet_NaN();
  const auto q = f8::cast(x, {});
  CHECK(std::isnan(q.scale.item<float>()));
  CHECK(q.data.to(at::kFloat).isnan().all().item<bool>());
  using titan::test::error_of;
  CHECK_THAT(error_of([] {
               f8::cast(at::ones({4, 4}, at::kDouble), {});
             }),
             Catch::Contains("expected a float32, bfloat16 or float16 tensor, got Double"));
  CHECK_THAT(error_of([] {
               f8::cast(at::ones({4, 4}), {.dtype = at::kBFloat16});
             }),
             Catch::Contains("expected CastSpec.dtype Float8_e4m3fn or Float8_e5m2, got BFloat16"));
  CHECK_THAT(error_of([] {
               f8::cast(at::ones({2, 4, 4}), {.scaling = f8::Scaling::kRowwise});
             }),
             Catch::Contains("expected a 2-D tensor (rows, cols), got 3 dims"));
  CHECK_THAT(error_of([] { f8::cast_transposed(at::ones({4}), {}); }),
             Catch::Contains("expected a 2-D tensor (rows, cols), got 1 dims"));
}

namespace {

/// Float32 values that sit on the float8 rounding decisions of `target` with scale 1: every float8
/// value, each midpoint between neighbours (the ties), one float32 ulp either side of each, both signs,
/// and the format's max as the amax (so the scale is exactly 1 and no value saturates).
at::Tensor rounding_boundaries(at::ScalarType target) {
  const at::Tensor grid = at::arange(256, at::kInt).to(at::kByte).view(target).to(at::kFloat);  // (256)
  const at::Tensor finite = std::get<0>(at::sort(grid.masked_select(grid.isfinite() & (grid >= 0))));
  const at::Tensor mid = (finite.slice(0, 0, -1) + finite.slice(0, 1)) / 2;  // exact in float32
  const at::Tensor up = at::nextafter(mid, at::full_like(mid, 1e9));
  const at::Tensor down = at::nextafter(mid, at::zeros_like(mid));
  const at::Tensor positive = at::cat({finite, mid, up, down});
  return at::cat({positive, -positive});
}

/// Same layout and bits; NaN matches any NaN (which payload comes out is not part of the contract, as for
/// the codes, where every NaN is one code).
bool same_values(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.strides() != b.strides()) return false;
  const at::Tensor both_nan = a.isnan() & b.isnan();
  return at::equal(a.view(at::kInt).masked_fill(both_nan, 0), b.view(at::kInt).masked_fill(both_nan, 0));
}

}  // namespace

TEST_CASE("float8 cast_values: the float32 values of a cast equal widened bytes over the scale, bit for bit",
          "[float8][cpu]") {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {3, 17}, {65, 130}, {200, 33}, {2, 4099}};
  for (const std::string& build : f8::detail::cpu_kernel_builds()) {
    for (auto source : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (auto target : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
        for (bool pow2 : {false, true}) {
          for (bool transposed : {false, true}) {
            for (const auto& [R, C] : shapes) {
              const f8::CastSpec spec{.dtype = target, .power_of_2_scales = pow2};
              const at::Tensor x = spread(R, C, source, static_cast<uint64_t>(R * 1000 + C + 7));
              const auto got = f8::detail::cpu_cast_values(x, spec, transposed, build);
              const auto want = f8::reference::cast_values(x, spec, transposed);
              INFO(build << " " << c10::toString(source) << " -> " << c10::toString(target) << (pow2 ? " pow2" : "")
                         << (transposed ? " transposed" : "") << " (" << R << ", " << C << ")");
              REQUIRE(got.values.scalar_type() == at::kFloat);
              REQUIRE(same_bytes(got.scale, want.scale));
              REQUIRE(same_values(got.values, want.values));
              // A given scale skips the amax: twice x's own, so values past half the amax saturate.
              const at::Tensor twice = want.scale * 2;
              const auto given = f8::detail::cpu_cast_values(x, spec, transposed, build, twice);
              REQUIRE(same_bytes(given.scale, twice));
              REQUIRE(same_values(given.values, f8::reference::cast_values(x, spec, transposed, twice).values));
            }
          }
        }
      }
    }
  }
  // Every rounding decision of both formats, ties included, in a vector body and a scalar tail.
  for (const std::string& build : f8::detail::cpu_kernel_builds()) {
    for (auto target : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      INFO(build << " " << c10::toString(target));
      const at::Tensor x = rounding_boundaries(target).view({1, -1});  // (1, n)
      const f8::CastSpec spec{.dtype = target};
      REQUIRE(f8::reference::cast(x, spec).scale.item<float>() == 1.0f);
      const auto got = f8::detail::cpu_cast_values(x, spec, false, build);
      CHECK(same_values(got.values, f8::reference::cast_values(x, spec).values));
      CHECK(same_values(got.values, x.to(target).to(at::kFloat)));  // scale 1: ATen's own rounding
    }
  }
}

TEST_CASE("float8 cast_values: N-d shapes, NaN, empty tensors and rowwise refused", "[float8][cpu]") {
  const at::Tensor x = at::randn({2, 3, 40});
  const auto got = f8::cast_values(x, {});
  CHECK(got.values.sizes() == x.sizes());
  CHECK(same_values(got.values, f8::reference::cast_values(x, {}).values));
  at::Tensor nan = at::randn({8, 32});
  nan[3][5] = std::numeric_limits<float>::quiet_NaN();
  CHECK(f8::cast_values(nan, {}).values.isnan().all().item<bool>());
  const auto empty = f8::cast_values(at::empty({0, 16}), {}, /*transposed=*/true);
  CHECK(empty.values.sizes() == at::IntArrayRef{16, 0});
  CHECK(empty.scale.item<float>() == f8::cast(at::empty({0, 16}), {}).scale.item<float>());
  CHECK_THAT(titan::test::error_of([] {
               (void)f8::cast_values(at::ones({4, 4}), {.scaling = f8::Scaling::kRowwise});
             }),
             Catch::Contains("expected tensorwise scaling, got rowwise"));
}

TEST_CASE("float8 dequantized_values: the emulated GEMMs' operands, per tensor, row or column, bit for bit",
          "[float8][cpu]") {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {3, 17}, {65, 130}, {200, 33}, {2, 4099}};
  const std::vector<std::pair<f8::ValuesLayout, const char*>> layouts = {{f8::ValuesLayout::kRows, "rows"},
                                                                         {f8::ValuesLayout::kTransposed, "transposed"},
                                                                         {f8::ValuesLayout::kColumns, "columns"}};
  for (const std::string& build : f8::detail::cpu_kernel_builds()) {
    for (auto source : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (auto target : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
        for (auto scaling : {f8::Scaling::kTensorwise, f8::Scaling::kRowwise}) {
          for (bool pow2 : {false, true}) {
            for (const auto& [layout, name] : layouts) {
              for (const auto& [R, C] : shapes) {
                const f8::CastSpec spec{.dtype = target, .scaling = scaling, .power_of_2_scales = pow2};
                const at::Tensor x = spread(R, C, source, static_cast<uint64_t>(R * 1000 + C + 11));
                const auto got = f8::detail::cpu_dequantized_values(x, spec, layout, build);
                const auto want = f8::reference::dequantized_values(x, spec, layout);
                INFO(build << " " << c10::toString(source) << " -> " << c10::toString(target)
                           << (scaling == f8::Scaling::kRowwise ? " rowwise" : " tensorwise") << (pow2 ? " pow2" : "")
                           << " " << name << " (" << R << ", " << C << ")");
                REQUIRE(got.scale.sizes() == want.scale.sizes());
                REQUIRE(same_bytes(got.scale.contiguous(), want.scale.contiguous()));
                REQUIRE(same_values(got.values, want.values));
              }
            }
          }
        }
      }
    }
  }
  // Every rounding decision of both formats, divided by a scale of exactly 1.
  for (const std::string& build : f8::detail::cpu_kernel_builds()) {
    for (auto target : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      const at::Tensor x = rounding_boundaries(target).view({1, -1});  // (1, n)
      const auto got = f8::detail::cpu_dequantized_values(x, {.dtype = target}, f8::ValuesLayout::kRows, build);
      CHECK(same_values(got.values, x.to(target).to(at::kFloat)));
    }
  }
}
