// SPDX-License-Identifier: BSD-3-Clause
// titan's float8 against torchao 0.18 (the oracle, tests/oracles/torchao_float8.py): the same inputs
// through both, and titan's casts, Float8Linear output, input gradient and weight gradient must equal
// torchao's bit for bit, also under CPU bf16 autocast (see docs/float8.md for why the arithmetic is the same).
#include <ATen/ATen.h>

#include "test_util.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/float8/cast.hpp"
#include "titan/float8/linear.hpp"
#include "titan/train/step.hpp"

namespace f8 = titan::float8;

namespace {

/// torchao's tensors, made once per test run.
const titan::checkpoint::SafetensorsFile& oracle() {
  static titan::test::TempDir dir;
  static const titan::checkpoint::SafetensorsFile file = [] {
    const auto path = dir.path / "torchao_float8.safetensors";
    REQUIRE(titan::test::run_python("torchao_float8.py", "\"" + path.string() + "\"") == 0);
    return titan::checkpoint::SafetensorsFile(path);
  }();
  return file;
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         at::equal(a.contiguous().reshape(-1).view(at::kByte), b.contiguous().reshape(-1).view(at::kByte));
}

std::string describe_difference(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor diff = (got.to(at::kDouble) - want.to(at::kDouble)).abs();
  return fmt::format("max |diff| {:.3g}, max |want| {:.3g}, {} of {} differ", diff.max().item<double>(),
                     want.abs().max().item<double>(), diff.ne(0).sum().item<int64_t>(), diff.numel());
}

}  // namespace

TEST_CASE("float8 oracle: titan's casts equal torchao's bytes and scales", "[float8][oracle][full]") {
  const auto& o = oracle();
  for (const std::string tag : {"f32", "bf16"}) {
    const at::Tensor x = o.read("cast." + tag + ".x");  // (40, 80)
    for (const auto& [name, dtype] : {std::pair{"e4m3", at::kFloat8_e4m3fn}, std::pair{"e5m2", at::kFloat8_e5m2}}) {
      for (bool pow2 : {false, true}) {
        for (const std::string gran : {"tensorwise", "rows", "cols"}) {
          const std::string key = "cast." + tag + "." + name + "." + gran + "." + (pow2 ? "pow2" : "exact");
          INFO(key);
          const f8::CastSpec spec{.dtype = dtype,
                                  .scaling = gran == "tensorwise" ? f8::Scaling::kTensorwise : f8::Scaling::kRowwise,
                                  .power_of_2_scales = pow2};
          // torchao's axiswise dim 0 is titan's rowwise cast of x^T.
          const f8::Float8Tensor q = gran == "cols" ? f8::cast_transposed(x, spec) : f8::cast(x, spec);
          const at::Tensor data = gran == "cols" ? q.data.t() : q.data;
          CHECK(same_bits(data.contiguous().view(at::kByte), o.read(key + ".data")));
          CHECK(same_bits(q.scale.reshape(-1), o.read(key + ".scale")));
        }
      }
    }
  }
}

TEST_CASE("float8 oracle: Float8Linear output and gradients equal torchao's Float8Linear", "[float8][oracle][full]") {
  const auto& o = oracle();
  const std::vector<std::pair<f8::Recipe, bool>> cases = {{f8::Recipe::kTensorwise, false},
                                                          {f8::Recipe::kTensorwise, true},
                                                          {f8::Recipe::kRowwise, true},
                                                          {f8::Recipe::kRowwiseWithGwHp, true}};
  for (const std::string tag : {"f32", "bf16"}) {
    for (const auto& [recipe, emulate] : cases) {
      const std::string name = std::string(f8::recipe_name(recipe)) + (emulate ? ".emulate." : ".scaled_mm.") + tag;
      const at::Tensor x = o.read(name + ".x").requires_grad_(true);  // (B, S, K)
      const at::Tensor w = o.read(name + ".w").requires_grad_(true);  // (N, K)
      const at::Tensor y = f8::float8_linear(x, w, {.recipe = recipe, .emulate = emulate});
      y.backward(o.read(name + ".grad_out"));
      for (const auto& [what, got] :
           {std::pair{"y", y.detach()}, std::pair{"grad_x", x.grad()}, std::pair{"grad_w", w.grad()}}) {
        const at::Tensor want = o.read(name + "." + what);
        INFO(name << " " << what << ": " << describe_difference(got, want));
        CHECK(same_bits(got, want));
      }
    }
  }
}

TEST_CASE("float8 oracle: Float8Linear under CPU bf16 autocast equals torchao's", "[float8][oracle][full]") {
  // fp32 input and weight, the forward under autocast: the input reaches its float8 cast in bf16, the
  // weight in fp32, and the output is bf16 (torchao's Float8Linear.forward as it runs under GPU autocast).
  const auto& o = oracle();
  const std::vector<std::pair<f8::Recipe, bool>> cases = {{f8::Recipe::kTensorwise, false},
                                                          {f8::Recipe::kTensorwise, true},
                                                          {f8::Recipe::kRowwise, true},
                                                          {f8::Recipe::kRowwiseWithGwHp, true}};
  for (const auto& [recipe, emulate] : cases) {
    const std::string name =
        std::string(f8::recipe_name(recipe)) + (emulate ? ".emulate" : ".scaled_mm") + ".autocast_bf16";
    const at::Tensor x = o.read(name + ".x").requires_grad_(true);  // (B, S, K) fp32
    const at::Tensor w = o.read(name + ".w");                       // (N, K) fp32
    f8::Float8Linear linear(w.size(1), w.size(0), at::kFloat, {.recipe = recipe, .emulate = emulate});
    {
      at::NoGradGuard no_grad;
      linear.weight.copy_(w);
    }
    at::Tensor y;  // (B, S, N) bf16
    {
      const titan::AutocastScope autocast(true, at::kCPU);
      y = linear.forward(x);
    }
    y.backward(o.read(name + ".grad_out"));  // outside autocast, as a training step runs it
    for (const auto& [what, got] :
         {std::pair{"y", y.detach()}, std::pair{"grad_x", x.grad()}, std::pair{"grad_w", linear.weight.grad()}}) {
      const at::Tensor want = o.read(name + "." + what);
      INFO(name << " " << what << ": " << describe_difference(got, want));
      CHECK(same_bits(got, want));
    }
  }
}
