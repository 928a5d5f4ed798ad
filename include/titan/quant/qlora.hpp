// SPDX-License-Identifier: BSD-3-Clause
// QLoRA (Dettmers et al., 2023; lora.quantize_base): the frozen base weight of each Linear nn::add_lora adapted held in
// NF4 instead of its dtype. The Linear then computes x dequant(W)^T through quant::nf4_linear, plus its adapters in
// their own precision, and its dense weight is freed (an empty tensor): a base costs 0.516 bytes an element. The
// adapters, every other parameter and the math around them are LoRA's. Quantise once the base weights are final (after
// the init or the checkpoint load that fills them): a later load has no dense tensor to fill. See docs/lora.md.
//
//   titan::nn::add_lora(model, {.rank = 8, .target_modules = {"wq", "wv"}});
//   model.init_weights();                 // or load the base
//   titan::nn::init_lora(model);
//   const auto bases = titan::quant::quantize_lora_base(model);
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/quant/nf4.hpp"

namespace torch::nn {
class Module;
}
namespace titan::nn {
class Linear;
}

namespace titan::quant {

/// A base weight quantize_lora_base put in NF4.
struct QloraBase {
  std::string path{};                         ///< the Linear's module path
  std::shared_ptr<const NF4Tensor> weight{};  ///< its weight in NF4; the Linear's matmul holds it too
};

/// The Linears of `model` that carry LoRA adapters, by path: the ones quantize_lora_base quantises. Throws naming the
/// module for a weight NF4 cannot cut (its size not a multiple of block_size x scaler_block_size), one float8
/// converted (its matmul already replaced) or one a parallel layout sharded: checked on the meta model, before
/// anything is allocated.
std::vector<std::pair<std::string, nn::Linear*>> lora_base_linears(torch::nn::Module& model,
                                                                   const NF4Config& config = {});

/// Puts the base weight of each of lora_base_linears(model) in NF4 (in the weight's dtype), routes the Linear's matmul
/// through nf4_linear and frees its dense weight. Returns them in module order.
std::vector<QloraBase> quantize_lora_base(torch::nn::Module& model, const NF4Config& config = {});

}  // namespace titan::quant
