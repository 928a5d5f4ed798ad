// SPDX-License-Identifier: BSD-3-Clause
// NF4 against torchao 0.18's NF4Tensor (the oracle, tests/oracles/torchao_nf4.py): the same weights through both
// give the same bytes (level indices, int8 scalers, factors, mean) and the same dequantised weight, bit for bit;
// nf4_linear is the linear of the dequantised weight, forward and backward, and leaves the weight without gradient.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "nf4_test_util.hpp"
#include "test_util.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/quant/nf4.hpp"

namespace titan::test::nf4_test {
namespace {

const checkpoint::SafetensorsFile& torchao_nf4() {
  static TempDir dir;
  static const checkpoint::SafetensorsFile file = [] {
    const auto path = dir.path / "torchao_nf4.safetensors";
    REQUIRE(run_python("torchao_nf4.py", "\"" + path.string() + "\"") == 0);
    return checkpoint::SafetensorsFile(path);
  }();
  return file;
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         at::equal(a.contiguous().reshape(-1).view(at::kByte), b.contiguous().reshape(-1).view(at::kByte));
}

}  // namespace

TEST_CASE("nf4 oracle: titan's NF4 bytes and dequantised weights equal torchao's NF4Tensor bit for bit",
          "[quant][nf4][oracle][full]") {
  const auto& o = torchao_nf4();
  for (const std::string name : {"normal", "outliers", "ties"}) {
    for (const std::string dtype : {"f32", "bf16"}) {
      const std::string key = name + "." + dtype;
      INFO(key);
      const quant::NF4Tensor q = quant::to_nf4(o.read(key + ".w"));
      CHECK(bitwise_equal(q.codes, o.read(key + ".codes")));
      CHECK(bitwise_equal(q.scalers, o.read(key + ".scalers")));
      CHECK(bitwise_equal(q.scaler_factors, o.read(key + ".factors")));
      CHECK(bitwise_equal(q.scaler_mean, o.read(key + ".mean")));
      CHECK(bitwise_equal(quant::dequantize(q), o.read(key + ".dequantized")));
    }
  }
}

TEST_CASE("nf4: each dequantised element is within its block's level spacing and scale error", "[quant][nf4]") {
  // The bound and its argument: nf4_test_util.hpp.
  const at::Tensor w = at::randn({256, 256}, at::make_generator<at::CPUGeneratorImpl>(3)) * 0.02;  // (256, 256)
  const quant::NF4Tensor q = quant::to_nf4(w);
  const at::Tensor back = quant::dequantize(q);                                      // (256, 256)
  const at::Tensor bound = std::get<0>(nf4_element_bound(w).view({-1, 64}).max(1));  // (1024)
  const at::Tensor error = std::get<0>((back - w).abs().view({-1, 64}).max(1));      // (1024)
  CHECK(error.le(bound).all().item<bool>());
  // Not lossless: the levels are 16.
  CHECK(error.max().item<double>() > 0);
  CHECK(q.nbytes() == w.numel() / 2 + w.numel() / 64 + 4 * (w.numel() / 64 / 256) + 4);
  CHECK(quant::nf4_nbytes(w.numel(), 4) == q.nbytes());
  CHECK(quant::nf4_nbytes(w.numel(), 2) == quant::to_nf4(w.to(at::kBFloat16)).nbytes());
}

TEST_CASE("nf4_linear: output and input gradient of the dequantised weight's linear, and no weight gradient",
          "[quant][nf4]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor w = (at::randn({128, 256}, gen) * 0.05).to(at::kBFloat16);  // (out 128, in 256)
  const quant::NF4Tensor q = quant::to_nf4(w);
  const at::Tensor x0 = at::randn({3, 7, 256}, gen).to(at::kBFloat16);  // (B, S, in)
  const at::Tensor dy = at::randn({3, 7, 128}, gen).to(at::kBFloat16);  // (B, S, out)

  const at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor y = quant::nf4_linear(x, q);
  y.backward(dy);
  const at::Tensor x_ref = x0.clone().requires_grad_(true);
  const at::Tensor w_ref = quant::dequantize(q).requires_grad_(true);
  const at::Tensor y_ref = at::linear(x_ref, w_ref);
  y_ref.backward(dy);
  CHECK(bitwise_equal(y, y_ref));
  CHECK(bitwise_equal(x.grad(), x_ref.grad()));
  CHECK_FALSE(q.codes.requires_grad());
  CHECK_FALSE(q.scaler_factors.grad().defined());
}

TEST_CASE("nf4: a weight that is not a whole number of scaler groups is refused naming its sizes", "[quant][nf4]") {
  CHECK_THROWS_WITH(quant::to_nf4(at::ones({64, 100})),
                    Catch::Contains("expected a weight whose 6400 elements are a multiple of block_size x "
                                    "scaler_block_size = 64 x 256") &&
                        Catch::Contains("[64, 100]"));
  CHECK_THROWS_WITH(quant::to_nf4(at::ones({4, 64, 256})), Catch::Contains("at most 2 dimensions"));
  CHECK_THROWS_WITH(quant::nf4_linear(at::ones({2, 100}), quant::to_nf4(at::ones({64, 256}))),
                    Catch::Contains("expected x's last dimension to equal the weight's input dimension"));
}

}  // namespace titan::test::nf4_test
