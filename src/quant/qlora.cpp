// SPDX-License-Identifier: BSD-3-Clause
#include "titan/quant/qlora.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include "titan/core/error.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/nn/layers.hpp"

namespace titan::quant {

std::vector<std::pair<std::string, nn::Linear*>> lora_base_linears(torch::nn::Module& model, const NF4Config& config) {
  std::vector<std::pair<std::string, nn::Linear*>> out;
  const int64_t unit = config.block_size * config.scaler_block_size;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* linear = dynamic_cast<nn::Linear*>(item.value().get());
    if (linear == nullptr || !linear->lora) continue;
    const std::string& path = item.key();
    TITAN_CHECK_VALUE(!linear->matmul,
                      "[titan::quant::quantize_lora_base] expected '{}' to compute its base with at::linear, got a "
                      "converted matmul (float8). NF4 bases and float8 GEMMs exclude each other: drop float8 from "
                      "model.converters or unset lora.quantize_base.",
                      path);
    TITAN_CHECK_VALUE(parallel::sharded_param(linear->weight) == nullptr,
                      "[titan::quant::quantize_lora_base] expected '{}.weight' whole, got it sharded by a parallel "
                      "layout (FSDP or TP). NF4 bases run on one device in this version: set every "
                      "parallelism.*_degree to 1, or unset lora.quantize_base.",
                      path);
    TITAN_CHECK_VALUE(linear->weight.numel() % unit == 0,
                      "[titan::quant::quantize_lora_base] expected '{}.weight' of a size NF4 can cut, a multiple of "
                      "block_size x scaler_block_size = {} x {} elements, got sizes {} ({} elements). Leave the "
                      "module out of lora.target_modules, or unset lora.quantize_base.",
                      path, config.block_size, config.scaler_block_size, c10::str(linear->weight.sizes()),
                      linear->weight.numel());
    out.emplace_back(path, linear);
  }
  return out;
}

std::vector<QloraBase> quantize_lora_base(torch::nn::Module& model, const NF4Config& config) {
  at::NoGradGuard no_grad;
  std::vector<QloraBase> out;
  for (const auto& [path, linear] : lora_base_linears(model, config)) {
    auto nf4 = std::make_shared<const NF4Tensor>(to_nf4(linear->weight.contiguous(), config));
    linear->matmul = [nf4](const at::Tensor& x, const at::Tensor& /*freed*/, const parallel::WeightUse& /*whole*/) {
      return nf4_linear(x, *nf4);
    };
    // set_data frees the storage for every handle (the Trainer's list of frozen tensors holds the same one).
    linear->weight.set_data(at::empty({0}, linear->weight.options()));
    out.push_back({.path = path, .weight = std::move(nf4)});
  }
  return out;
}

}  // namespace titan::quant
