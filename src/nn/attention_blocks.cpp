// SPDX-License-Identifier: BSD-3-Clause
#include "attention_blocks.hpp"

#include <ATen/ATen.h>

#include <limits>

#include "titan/core/error.hpp"

namespace titan::nn::detail {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
// The memory-efficient CUDA kernel reads its bias in rows aligned to this many elements.
constexpr int64_t kBiasAlign = 16;

// CUDA's memory-efficient kernel wants as many K/V heads as query heads.
at::Tensor repeat_heads(const at::Tensor& kv, int64_t heads) {
  const int64_t groups = heads / kv.size(1);
  return groups == 1 ? kv : kv.repeat_interleave(groups, 1);
}

at::Tensor sum_heads(const at::Tensor& grad, int64_t kv_heads) {
  const int64_t groups = grad.size(1) / kv_heads;
  if (groups == 1) return grad;
  return grad.unflatten(1, {kv_heads, groups}).sum(2);
}

// (B, 1, Lq, Lk) -> (B, H, Lq, Lk) with rows aligned as the CUDA kernel reads them.
at::Tensor cuda_bias(const at::Tensor& additive, int64_t heads) {
  if (!additive.defined()) return {};
  const int64_t lk = additive.size(-1);
  const int64_t padded = (lk + kBiasAlign - 1) / kBiasAlign * kBiasAlign;
  at::Tensor bias = additive.expand({additive.size(0), heads, additive.size(2), lk});
  if (padded == lk) return bias.contiguous();
  at::Tensor storage = at::zeros({bias.size(0), heads, bias.size(2), padded}, bias.options());
  storage.narrow(-1, 0, lk).copy_(bias);
  return storage.narrow(-1, 0, lk);
}

// Rows that see no key carry the kernels' placeholder lse (0 on CPU): mark them -inf.
at::Tensor masked_lse(at::Tensor lse, const BlockMask& mask) {
  if (!mask.visible.defined()) return lse;
  return lse.masked_fill(mask.visible.logical_not(), kNegInf);
}

}  // namespace

BlockResult attend_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const BlockMask& mask,
                         double scale) {
  const std::optional<at::Tensor> additive =
      mask.additive.defined() ? std::optional<at::Tensor>(mask.additive) : std::nullopt;
  if (q.is_cuda()) {
    const int64_t heads = q.size(1);
    const at::Tensor bias = cuda_bias(mask.additive, heads);
    auto [out, lse, seed, offset] =
        at::_scaled_dot_product_efficient_attention(q, repeat_heads(k, heads), repeat_heads(v, heads),
                                                    bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt,
                                                    /*compute_log_sumexp=*/true, /*dropout_p=*/0.0, mask.causal, scale);
    at::Tensor rows = lse.narrow(2, 0, q.size(2)).to(at::kFloat);  // the kernel pads lse's rows
    return {out, masked_lse(std::move(rows), mask)};
  }
  auto [out, lse] =
      at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, /*dropout_p=*/0.0, mask.causal, additive, scale);
  return {out, masked_lse(lse.to(at::kFloat), mask)};
}

std::array<at::Tensor, 3> attend_block_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                const BlockMask& mask, double scale) {
  if (q.is_cuda()) {
    const int64_t heads = q.size(1);
    const at::Tensor bias = cuda_bias(mask.additive, heads);
    const at::Tensor none = at::zeros({}, q.options().dtype(at::kLong));  // dropout 0: the seed is unused
    auto [dq, dk, dv, dbias] = at::_scaled_dot_product_efficient_attention_backward(
        grad_out, q, repeat_heads(k, heads), repeat_heads(v, heads), bias, out, lse.contiguous(), none, none,
        /*dropout_p=*/0.0, {true, true, true, false}, mask.causal, scale);
    return {dq, sum_heads(dk, k.size(1)), sum_heads(dv, v.size(1))};
  }
  const std::optional<at::Tensor> additive =
      mask.additive.defined() ? std::optional<at::Tensor>(mask.additive) : std::nullopt;
  auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out.contiguous(), q, k, v, out, lse.contiguous(), /*dropout_p=*/0.0, mask.causal, additive, scale);
  return {dq, dk, dv};
}

void merge_block(at::Tensor& out, at::Tensor& lse, const BlockResult& block) {
  const at::Tensor merged = at::logaddexp(lse, block.lse);  // (B, H, Lq); -inf only if neither sees a key
  const at::Tensor nothing = merged.isneginf();
  // exp(lse - merged) with 0 where a side sees nothing (never exp(-inf - -inf)).
  const at::Tensor w_old = at::exp(lse - merged).masked_fill(nothing, 0).unsqueeze(-1);        // (B, H, Lq, 1)
  const at::Tensor w_new = at::exp(block.lse - merged).masked_fill(nothing, 0).unsqueeze(-1);  // (B, H, Lq, 1)
  // A row that sees no key in the block contributes nothing, whatever the kernel left in it.
  const at::Tensor block_out = block.out.to(at::kFloat).masked_fill(block.lse.isneginf().unsqueeze(-1), 0);
  out = out * w_old + block_out * w_new;
  lse = merged;
}

}  // namespace titan::nn::detail
