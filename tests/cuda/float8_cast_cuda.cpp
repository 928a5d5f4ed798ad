// SPDX-License-Identifier: BSD-3-Clause
// The CUDA float8 cast kernels against the CPU ones (which equal the ATen reference bit for bit,
// tests/float8/cast_test.cpp): same bytes and scales for every source dtype, float8 dtype, scaling,
// transposition and shapes with partial tiles.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "titan/float8/cast.hpp"

namespace f8 = titan::float8;

namespace {

at::Tensor spread(int64_t rows, int64_t cols, at::ScalarType dtype) {
  at::Tensor x = at::randn({rows, cols}) * at::exp(at::randn({rows, cols}) * 3.0);
  const at::Tensor position = at::arange(rows * cols).view({rows, cols});
  x.masked_fill_(position % 7 == 0, 0.0);
  x.masked_fill_(position % 11 == 3, -0.0);
  return x.to(dtype);
}

// Bytes equal element by element, except that a NaN may be any NaN: x86 and CUDA disagree on the sign of the
// NaN a conversion makes (a half input that overflows gives one), and nothing reads a float8 NaN's bits.
bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const at::Tensor x = a.cpu().reshape(-1);         // (n)
  const at::Tensor y = b.cpu().reshape(-1);         // (n)
  const at::Tensor nan = x.to(at::kFloat).isnan();  // (n)
  if (!at::equal(nan, y.to(at::kFloat).isnan())) return false;
  const at::Tensor keep = nan.logical_not();     // (n)
  const auto bytes = [&](const at::Tensor& t) {  // (kept, element size)
    return t.view(at::kByte).reshape({t.numel(), t.element_size()}).index({keep});
  };
  return at::equal(bytes(x), bytes(y));
}

}  // namespace

TEST_CASE("float8 cast (CUDA): kernels equal the CPU kernels bit for bit", "[float8][cuda]") {
  at::manual_seed(3);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},    {3, 17},    {64, 64},
                                                           {65, 130}, {1000, 33}, {2, 40000}};
  for (auto source : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (auto target : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      for (auto scaling : {f8::Scaling::kTensorwise, f8::Scaling::kRowwise}) {
        for (bool pow2 : {false, true}) {
          for (bool transposed : {false, true}) {
            for (const auto& [R, C] : shapes) {
              const f8::CastSpec spec{.dtype = target, .scaling = scaling, .power_of_2_scales = pow2};
              const at::Tensor x = spread(R, C, source);
              const auto want = transposed ? f8::cast_transposed(x, spec) : f8::cast(x, spec);
              const auto got = transposed ? f8::cast_transposed(x.cuda(), spec) : f8::cast(x.cuda(), spec);
              INFO(c10::toString(source) << " -> " << c10::toString(target)
                                         << (scaling == f8::Scaling::kRowwise ? " rowwise" : " tensorwise")
                                         << (pow2 ? " pow2" : "") << (transposed ? " transposed" : "") << " (" << R
                                         << ", " << C << ")");
              REQUIRE(got.data.is_cuda());
              REQUIRE(same_bytes(got.scale, want.scale));
              REQUIRE(same_bytes(got.data, want.data));
            }
          }
        }
      }
    }
  }
}
