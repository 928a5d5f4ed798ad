// SPDX-License-Identifier: BSD-3-Clause
// Float8Linear without an oracle: close to the fp32 Linear in every recipe, the module and the free
// function agree, recipe names parse, and torchtitan's conversion filter (dims % 16, filter_fqns).
#include <ATen/ATen.h>

#include "test_util.hpp"
#include "titan/float8/cast.hpp"
#include "titan/float8/linear.hpp"

namespace f8 = titan::float8;

namespace {
double relative_error(const at::Tensor& got, const at::Tensor& want) {
  return ((got - want).norm() / want.norm()).item<double>();
}
}  // namespace

TEST_CASE("Float8Linear: every recipe stays close to the fp32 Linear in output and gradients", "[float8][cpu]") {
  at::manual_seed(7);
  const at::Tensor x0 = at::randn({4, 16, 128});
  const at::Tensor w0 = at::randn({64, 128}) / 11.0;
  const at::Tensor go = at::randn({4, 16, 64});
  const at::Tensor x_ref = x0.clone().requires_grad_(true);
  const at::Tensor w_ref = w0.clone().requires_grad_(true);
  at::matmul(x_ref, w_ref.t()).backward(go);
  const at::Tensor y_ref = at::matmul(x0, w0.t());
  for (auto recipe : {f8::Recipe::kTensorwise, f8::Recipe::kRowwise, f8::Recipe::kRowwiseWithGwHp}) {
    for (bool emulate : {false, true}) {
      f8::Float8Linear layer(128, 64, at::kFloat, {.recipe = recipe, .emulate = emulate});
      {
        at::NoGradGuard no_grad;
        layer.weight.copy_(w0);
      }
      const at::Tensor x = x0.clone().requires_grad_(true);
      const at::Tensor y = layer.forward(x);
      y.backward(go);
      INFO(f8::recipe_name(recipe) << (emulate ? " emulated" : ""));
      // e4m3 keeps 3 mantissa bits (relative step 2^-4), e5m2 gradients 2 bits: errors of a few percent.
      CHECK(relative_error(y, y_ref) < 0.05);
      CHECK(relative_error(x.grad(), x_ref.grad()) < (recipe == f8::Recipe::kTensorwise ? 0.12 : 0.05));
      CHECK(relative_error(layer.weight.grad(), w_ref.grad()) <
            (recipe == f8::Recipe::kRowwiseWithGwHp ? 1e-6 : (recipe == f8::Recipe::kTensorwise ? 0.12 : 0.05)));
      CHECK(at::equal(y, f8::float8_linear(x0, w0, layer.config)));
    }
  }
}

TEST_CASE("Float8Linear: recipe names are torchao's and a wrong one names the valid ones", "[float8][cpu]") {
  for (auto recipe : {f8::Recipe::kTensorwise, f8::Recipe::kRowwise, f8::Recipe::kRowwiseWithGwHp}) {
    CHECK(f8::recipe_from_name(f8::recipe_name(recipe)) == recipe);
  }
  CHECK(titan::test::error_of([] { f8::recipe_from_name("rowwise_hp"); }) ==
        "[titan::float8] expected recipe_name tensorwise, rowwise or rowwise_with_gw_hp, got \"rowwise_hp\".");
  CHECK_THAT(titan::test::error_of([] {
               f8::float8_linear(at::ones({2, 32}), at::ones({16, 48}), {});
             }),
             Catch::Contains("expected input (..., 48) for weight (16, 48), got last dim 32"));
}

TEST_CASE("Float8Linear: a Linear with a dim not divisible by 16 or a filtered name is skipped with the reason",
          "[float8][cpu]") {
  CHECK_FALSE(f8::float8_skip_reason("layers.0.attention.wq", 4096, 4096).has_value());
  CHECK(f8::float8_skip_reason("layers.0.feed_forward.w1", 1000, 4096) ==
        "weight (1000, 4096) has a dim not divisible by 16 (float8 GEMMs need multiples of 16)");
  CHECK(f8::float8_skip_reason("layers.0.feed_forward.w1", 4096, 4104).has_value());
  CHECK(f8::float8_skip_reason("output", 4096, 4096, {"output", "router"}) ==
        "its name contains filter_fqns entry \"output\"");
  CHECK(f8::should_convert_to_float8("layers.1.attention.wo", 256, 256, {"output"}));
  CHECK_FALSE(f8::should_convert_to_float8("layers.1.attention.wo", 250, 256));
}

TEST_CASE("Float8Linear on CPU: rowwise GEMMs are the emulated ones whatever emulate says, bit for bit",
          "[float8][cpu]") {
  // The oracle test covers the emulated rowwise recipes against torchao; on CPU, where _scaled_mm takes no
  // rowwise scales, emulate = false must run the same arithmetic in the same operand layouts.
  at::manual_seed(11);
  const at::Tensor x0 = at::randn({3, 16, 64});
  const at::Tensor w0 = at::randn({48, 64}) / 8.0;
  const at::Tensor go = at::randn({3, 16, 48});
  for (auto recipe : {f8::Recipe::kRowwise, f8::Recipe::kRowwiseWithGwHp}) {
    std::vector<at::Tensor> results[2];  // y, grad_x, grad_w, for emulate false and true
    for (bool emulate : {false, true}) {
      const at::Tensor x = x0.clone().requires_grad_(true);
      const at::Tensor w = w0.clone().requires_grad_(true);
      const at::Tensor y = f8::float8_linear(x, w, {.recipe = recipe, .emulate = emulate});
      y.backward(go);
      results[emulate ? 1 : 0] = {y.detach(), x.grad(), w.grad()};
    }
    INFO(f8::recipe_name(recipe));
    // The forward from float8 bytes, as the emulation computes it: x per row, w per output row (its
    // transpose a column-major view), each widened and divided by its scales.
    const f8::CastSpec rows{.scaling = f8::Scaling::kRowwise, .power_of_2_scales = true};
    const f8::Float8Tensor qx = f8::cast(x0.reshape({-1, 64}), rows);  // (48, 64), scales (48, 1)
    const f8::Float8Tensor qw = f8::cast(w0, rows);                    // (48, 64), scales (48, 1)
    const at::Tensor y_bytes = at::mm(f8::to_float(qx.data).div(qx.scale), f8::to_float(qw.data.t()).div(qw.scale.t()));
    CHECK(at::equal(results[0][0].reshape({-1, 48}), y_bytes));
    CHECK(at::equal(results[0][0], results[1][0]));
    CHECK(at::equal(results[0][2], results[1][2]));
    if (recipe == f8::Recipe::kRowwise) {
      CHECK(at::equal(results[0][1], results[1][1]));
    } else {
      // rowwise_with_gw_hp's tensorwise weight reaches the grad_input GEMM column-major without emulate
      // (torchao's _scaled_mm layout) and row-major with it: the same values, summed in another order.
      CHECK(at::allclose(results[0][1], results[1][1], 1e-5, 1e-6));
    }
  }
}
