// SPDX-License-Identifier: BSD-3-Clause
// RoPE: Llama 3.1 frequency scaling against values computed independently here in double precision,
// rotation equals complex multiplication of adjacent pairs, and relative-position invariance.
#include <ATen/ATen.h>

#include <cmath>
#include <numbers>

#include "test_util.hpp"
#include "titan/nn/rope.hpp"

TEST_CASE("rope frequencies apply Llama 3.1 scaling", "[nn][rope]") {
  const titan::nn::RopeConfig config{.head_dim = 128, .max_positions = 16, .theta = 500000};
  const at::Tensor f = titan::nn::rope_frequencies(config);
  REQUIRE(f.size(0) == 64);
  for (int64_t i = 0; i < 64; ++i) {
    const double base = 1.0 / std::pow(500000.0, static_cast<double>(2 * i) / 128.0);
    const double wavelen = 2 * std::numbers::pi / base;
    double expected = base;
    if (wavelen > 8192.0) {
      expected = base / 8.0;
    } else if (wavelen >= 2048.0) {
      const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
      expected = (1 - smooth) * base / 8.0 + smooth * base;
    }
    INFO("i = " << i);
    CHECK(f[i].item<double>() == Approx(expected).epsilon(1e-5));
  }
  // The lowest frequency is divided by 8, the highest untouched.
  CHECK(f[63].item<double>() < 1.0 / std::pow(500000.0, 126.0 / 128.0) / 7.9);
  CHECK(f[0].item<double>() == Approx(1.0));
}

TEST_CASE("rope rotates adjacent pairs like a complex product", "[nn][rope]") {
  const titan::nn::RopeConfig config{.head_dim = 8, .max_positions = 5, .theta = 10000, .llama3_scaling = false};
  const auto tables = titan::nn::make_rope_tables(config, at::kCPU);
  at::manual_seed(3);
  const at::Tensor x = at::randn({1, 5, 2, 8});  // (B, S, H, HD)
  const at::Tensor out = titan::nn::apply_rope(x, tables);
  const at::Tensor xc = at::view_as_complex(x.unflatten(-1, {4, 2}).contiguous());  // (B, S, H, 4)
  const at::Tensor angles = at::outer(at::arange(5, at::kFloat), titan::nn::rope_frequencies(config));
  const at::Tensor rot = at::polar(at::ones_like(angles), angles).unsqueeze(1);  // (S, 1, 4)
  const at::Tensor expected = at::view_as_real(xc * rot).flatten(-2);
  CHECK(at::allclose(out, expected, 1e-5, 1e-6));
  // Position 0 is the identity; rotations preserve norms.
  CHECK(at::allclose(out.select(1, 0), x.select(1, 0)));
  CHECK(at::allclose(out.norm(2, -1), x.norm(2, -1), 1e-5, 1e-5));
}
