// SPDX-License-Identifier: BSD-3-Clause
// NF4: 4-bit NormalFloat weights with double-quantised block scales, QLoRA's storage for frozen base weights
// (Dettmers et al., 2023) in the layout of torchao's NF4Tensor, whose bytes titan's equal (tests/quant/nf4_test.cpp).
// Each block of `block_size` consecutive elements is divided by its absmax and each quotient rounded to the nearest
// of 16 levels; the absmaxes, less their mean, are themselves quantised to int8 per `scaler_block_size` of them.
// A weight costs 4 bits an element plus 8 bits a block (0.516 bytes an element at the defaults, against 2 in bf16).
//
// Example:
//   const titan::quant::NF4Tensor w4 = titan::quant::to_nf4(w);  // w: (out, in) bf16, frozen
//   at::Tensor y = titan::quant::nf4_linear(x, w4);                // x W^T, W dequantised on use
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace titan::quant {

/// How a weight is cut into blocks (QLoRA's and torchao's defaults).
struct NF4Config {
  /// elements per absmax-scaled block
  int64_t block_size = 64;
  /// block absmaxes per int8-quantised group of them
  int64_t scaler_block_size = 256;
};

/// A weight in NF4, as torchao's NF4Tensor holds it.
struct NF4Tensor {
  at::Tensor codes;            // (numel / 2) uint8: two 4-bit level indices a byte, the even element in the high nibble
  at::Tensor scalers;          // (numel / block_size) int8: each block's absmax less scaler_mean, quantised
  at::Tensor scaler_factors;   // (numel / block_size / scaler_block_size) dtype: 256 / (2 absmax) of each group
  at::Tensor scaler_mean;      // () dtype: the mean of the block absmaxes
  std::vector<int64_t> shape;  ///< the weight's shape
  at::ScalarType dtype;        ///< the weight's dtype, also that of the levels, factors and mean
  NF4Config config;            ///< its blocks
  /// Bytes held (codes, scalers, factors, mean).
  int64_t nbytes() const;
};

/// Bytes `to_nf4` gives a weight of `numel` elements whose dtype takes `dtype_bytes`: numel / 2 of codes, a byte a
/// block, a factor a group and the mean (0.5 + 1/64 + dtype_bytes / (64 x 256) an element at the defaults).
int64_t nf4_nbytes(int64_t numel, int64_t dtype_bytes, const NF4Config& config = {});

/// The 16 NF4 levels in `dtype`: quantiles of a standard normal, scaled into [-1, 1].
at::Tensor nf4_levels(at::ScalarType dtype);  // (16)

/// `weight` in NF4 (at most 2-D, contiguous; its size a multiple of block_size x scaler_block_size). Throws naming
/// the sizes otherwise.
NF4Tensor to_nf4(const at::Tensor& weight, const NF4Config& config = {});

/// The weight back in its dtype: each level times its block's dequantised absmax.
at::Tensor dequantize(const NF4Tensor& weight);  // (shape) dtype

/// x W^T with W = dequantize(weight) in x's dtype, recomputed in the backward rather than kept: autograd holds the
/// NF4 bytes only. The weight is frozen (it gets no gradient); x's gradient is dy W.
at::Tensor nf4_linear(const at::Tensor& x, const NF4Tensor& weight);  // (..., in) -> (..., out)

}  // namespace titan::quant
