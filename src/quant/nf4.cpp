// SPDX-License-Identifier: BSD-3-Clause
// NF4 in plain ATen, op for op as torchao's NF4Tensor computes it (from_tensor, double_quantize_scalers,
// convert_to_norm_float_weight, get_original_weight), so that every rounding happens in the same dtype at the same
// place and the bytes agree. Where torchao writes `256 / t`, Python computes t.reciprocal() * 256: so does this file.
#include "titan/quant/nf4.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>

#include "titan/core/error.hpp"

namespace titan::quant {
namespace {

// Each row's absmax (torchao's get_block_absmax).
at::Tensor block_absmax(const at::Tensor& flat, int64_t block) {  // (n) -> (n / block)
  return std::get<0>(flat.view({flat.numel() / block, block}).abs().max(1));
}

}  // namespace

int64_t NF4Tensor::nbytes() const {
  return codes.nbytes() + scalers.nbytes() + scaler_factors.nbytes() + scaler_mean.nbytes();
}

int64_t nf4_nbytes(int64_t numel, int64_t dtype_bytes, const NF4Config& config) {
  const int64_t blocks = numel / config.block_size;
  return numel / 2 + blocks + (blocks / config.scaler_block_size + 1) * dtype_bytes;
}

at::Tensor nf4_levels(at::ScalarType dtype) {
  // Rounded as torchao rounds its Python floats: to float, then to dtype.
  static constexpr std::array<float, 16> kLevels = {-1.0000f, -0.6962f, -0.5251f, -0.3949f, -0.2844f, -0.1848f,
                                                    -0.0911f, 0.0000f,  0.0796f,  0.1609f,  0.2461f,  0.3379f,
                                                    0.4407f,  0.5626f,  0.7230f,  1.0000f};
  return at::tensor(at::ArrayRef<float>(kLevels.data(), kLevels.size()), at::kFloat).to(dtype);
}

NF4Tensor to_nf4(const at::Tensor& weight, const NF4Config& config) {
  const int64_t numel = weight.numel(), block = config.block_size, group = config.scaler_block_size;
  TITAN_CHECK_VALUE(weight.dim() <= 2 && weight.is_contiguous(),
                    "[titan::quant::to_nf4] expected a contiguous weight of at most 2 dimensions, got sizes {}{}. "
                    "Quantise each matrix of a stacked weight on its own.",
                    c10::str(weight.sizes()), weight.is_contiguous() ? "" : " (not contiguous)");
  TITAN_CHECK_VALUE(block > 0 && group > 0 && block % 2 == 0 && numel % (block * group) == 0,
                    "[titan::quant::to_nf4] expected a weight whose {} elements are a multiple of block_size x "
                    "scaler_block_size = {} x {} (block_size even), got sizes {}. Leave this weight in its dtype, or "
                    "choose blocks that divide it.",
                    numel, block, group, c10::str(weight.sizes()));
  at::NoGradGuard no_grad;
  const at::Tensor flat = weight.flatten();  // (numel)
  const int64_t n_blocks = numel / block, n_groups = n_blocks / group;

  // Double quantisation of the block absmaxes.
  const at::Tensor absmax = block_absmax(flat, block);               // (n_blocks)
  const at::Tensor mean = absmax.mean();                             // ()
  const at::Tensor centred = absmax - mean;                          // (n_blocks)
  const at::Tensor group_absmax = block_absmax(centred, group);      // (n_groups)
  const at::Tensor factors = (2 * group_absmax).reciprocal() * 256;  // (n_groups)
  const at::Tensor scalers = (centred.view({n_groups, group}) * factors.unsqueeze(-1)).round().clamp(-128, 127);

  // Each element to its nearest level (the first of two equally near), two a byte.
  const at::Tensor scaled = flat.view({n_blocks, block}) / absmax.unsqueeze(-1);  // (n_blocks, block)
  const at::Tensor distance = (scaled.flatten().unsqueeze(-1) - nf4_levels(weight.scalar_type())).abs();  // (numel, 16)
  const at::Tensor index = std::get<1>(distance.min(-1)).to(at::kByte);                                   // (numel)
  const at::Tensor codes =
      at::bitwise_or(index.slice(0, 0, numel, 2).bitwise_left_shift(4), index.slice(0, 1, numel, 2));

  return {.codes = codes.contiguous(),
          .scalers = scalers.flatten().to(at::kChar),
          .scaler_factors = factors.contiguous(),
          .scaler_mean = mean,
          .shape = weight.sizes().vec(),
          .dtype = weight.scalar_type(),
          .config = config};
}

at::Tensor dequantize(const NF4Tensor& weight) {
  at::NoGradGuard no_grad;
  const int64_t group = weight.config.scaler_block_size, block = weight.config.block_size;
  // Both nibbles of each byte in element order, then one level lookup and one product an element (torchao's values:
  // each element is its level times its block's absmax, rounded once in dtype), without a per-element absmax copy.
  const at::Tensor index =
      at::stack({weight.codes.bitwise_right_shift(4), weight.codes.bitwise_and(15)}, -1);             // (n/2, 2)
  const at::Tensor levels = nf4_levels(weight.dtype).index_select(0, index.flatten().to(at::kLong));  // (numel)
  const int64_t n_groups = weight.scalers.numel() / group;
  const at::Tensor absmax =
      (weight.scalers.view({n_groups, group}) / weight.scaler_factors.unsqueeze(-1)).flatten().to(weight.dtype) +
      weight.scaler_mean;  // (n_blocks)
  return (levels.view({absmax.size(0), block}) * absmax.unsqueeze(-1)).reshape(weight.shape);
}

namespace {

// y = x W^T that saves the NF4 bytes, not W: a frozen base weight costs autograd half a byte an element.
struct NF4Linear : torch::autograd::Function<NF4Linear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& codes,
                            const at::Tensor& scalers, const at::Tensor& factors, const at::Tensor& mean,
                            const NF4Tensor& weight) {
    ctx->save_for_backward({codes, scalers, factors, mean});
    ctx->saved_data["shape"] = weight.shape;
    ctx->saved_data["dtype"] = static_cast<int64_t>(weight.dtype);
    ctx->saved_data["block_size"] = weight.config.block_size;
    ctx->saved_data["scaler_block_size"] = weight.config.scaler_block_size;
    return at::linear(x, dequantize(weight).to(x.scalar_type()));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const NF4Tensor weight{.codes = saved[0],
                           .scalers = saved[1],
                           .scaler_factors = saved[2],
                           .scaler_mean = saved[3],
                           .shape = ctx->saved_data["shape"].toIntVector(),
                           .dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt()),
                           .config = {.block_size = ctx->saved_data["block_size"].toInt(),
                                      .scaler_block_size = ctx->saved_data["scaler_block_size"].toInt()}};
    const at::Tensor& dy = grads[0];  // (..., out)
    return {dy.matmul(dequantize(weight).to(dy.scalar_type())), {}, {}, {}, {}, {}};
  }
};

}  // namespace

at::Tensor nf4_linear(const at::Tensor& x, const NF4Tensor& weight) {
  TITAN_CHECK_VALUE(weight.shape.size() == 2 && x.size(-1) == weight.shape[1],
                    "[titan::quant::nf4_linear] expected x's last dimension to equal the weight's input dimension "
                    "(weight of shape {}), got x of sizes {}. Pass the weight of this layer.",
                    c10::str(at::IntArrayRef(weight.shape)), c10::str(x.sizes()));
  return NF4Linear::apply(x, weight.codes, weight.scalers, weight.scaler_factors, weight.scaler_mean, weight);
}

}  // namespace titan::quant
