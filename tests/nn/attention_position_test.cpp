// SPDX-License-Identifier: BSD-3-Clause
// nn::Attention without a position encoding of its own (positions learned elsewhere, GPT-2): plain causal attention
// of the biased projections, against SDPA on hand-made q, k, v; the RoPE tables are not read (none are given); with
// RoPE the same weights attend differently.
#include <ATen/ATen.h>

#include "test_util.hpp"
#include "titan/nn/attention.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/rope.hpp"

using namespace titan;

TEST_CASE("Attention without RoPE is causal attention of its biased projections", "[nn][attention][positions]") {
  constexpr int64_t kDim = 16, kHeads = 4, kHeadDim = kDim / kHeads, kSeq = 6;
  nn::Attention attention(kDim, kHeads, kHeads, at::TensorOptions(),
                          {.position_encoding = nn::PositionEncoding::none, .bias = true});
  for (auto& item : attention.named_parameters(/*recurse=*/true)) {
    nn::normal_(item.value(), nn::InitSite(2) / item.key(), 0.0, 0.3);
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
  const at::Tensor x = at::randn({2, kSeq, kDim}, gen);  // (B, S, D)
  const at::Tensor got = attention.forward(x, nn::RopeTables{});

  const auto heads = [&](const nn::Linear& l) {  // (B, S, D) -> (B, H, S, HD)
    return at::linear(x, l.weight, l.bias).view({2, kSeq, kHeads, kHeadDim}).transpose(1, 2);
  };
  const at::Tensor out = at::scaled_dot_product_attention(heads(*attention.wq), heads(*attention.wk),
                                                          heads(*attention.wv), {}, 0.0, /*is_causal=*/true);
  const at::Tensor want =
      at::linear(out.transpose(1, 2).reshape({2, kSeq, kDim}), attention.wo->weight, attention.wo->bias);
  CHECK(at::allclose(got, want, 1e-5, 1e-6));

  // The same weights with RoPE attend by relative position: another result.
  nn::Attention rotary(kDim, kHeads, kHeads, at::TensorOptions(), {.bias = true});
  {
    at::NoGradGuard no_grad;
    const auto theirs = attention.named_parameters(/*recurse=*/true);
    for (auto& item : rotary.named_parameters(/*recurse=*/true)) item.value().copy_(theirs[item.key()]);
  }
  const nn::RopeTables rope = nn::make_rope_tables({.head_dim = kHeadDim, .max_positions = kSeq}, at::kCPU);
  CHECK_FALSE(at::allclose(rotary.forward(x, rope), got, 1e-3, 1e-4));
}
