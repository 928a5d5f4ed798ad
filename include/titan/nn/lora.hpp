// SPDX-License-Identifier: BSD-3-Clause
// LoRA as a model converter (torchtitan's model.converters lora; Hu et al., 2021): each targeted titan::nn::Linear
// gains two trainable submodules, lora_a (rank x in) and lora_b (out x rank), and computes
//   y = x W^T (+ b) + (alpha / rank) * lora_b(lora_a(dropout(x)))
// while every other parameter of the model is frozen (requires_grad false: no gradient, no optimizer state). Names
// and initialisation are torchtitan's (layers.0.attention.wq.lora_a.weight; lora_a Kaiming-uniform, lora_b zeros, so
// a converted model starts as its base). Parallel layouts place the adapters as their Linear's weight
// (parallel::ShardableLayer::Adapter). Routed experts (stacked weights, no Linear) and MoE routers get none: a router's
// adapter would move routing, and Hugging Face's MoE routers are no Linear PEFT could load one onto. See docs/lora.md.
//
//   const auto report = titan::nn::add_lora(model, {.rank = 8, .alpha = 16, .target_modules = {"wq", "wv"}});
//   auto parallel = titan::parallelize(model, mesh, plan);
//   model.init_weights();
//   titan::nn::init_lora(model);  // after the base init: every rank fills its shards, any layout alike
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace torch::nn {
class Module;
}
namespace titan {
struct LoraConfig;
}

namespace titan::nn {

/// What add_lora adapts, and how.
struct LoraOptions {
  /// rank r of lora_a (r, in_features) and lora_b (out_features, r)
  int64_t rank = 8;
  /// the adapters' output is scaled by alpha / rank
  double alpha = 16.0;
  /// dropout probability on the adapters' input, in training mode only
  double dropout = 0.0;
  /// Linears to adapt by FQN pattern: an entry matches a path equal to it or ending in "." + it, '*' standing for
  /// any characters within one name (wq, attention.wq, layers.*.feed_forward.w2); empty: every Linear but MoE routers
  std::vector<std::string> target_modules{};
  /// fail on a target_modules entry that matches nothing (off for a pipeline stage's part of a model checked whole)
  bool require_matches = true;
};

/// The options [lora] describes: rank, alpha, dropout, target_modules.
LoraOptions lora_options(const LoraConfig& config);

/// What a conversion did.
struct LoraConversion {
  std::vector<std::string> adapted{};  ///< module paths of the Linears given adapters, in module order
  int64_t linears = 0;                 ///< Linears it could have adapted (MoE routers and adapters aside)
  int64_t adapter_params = 0;          ///< elements of their adapters (whole tensors)
  int64_t frozen_params = 0;           ///< elements of every other parameter, now frozen
};

/// Gives each targeted Linear of `model` (whole, not yet parallelized) its adapters, on the weight's device and dtype,
/// and freezes every other parameter. Throws naming the lora.* key for a rank <= 0, an alpha <= 0, a
/// dropout outside [0, 1), an entry of target_modules that matches no Linear it may adapt (with require_matches), or a
/// Linear adapted before.
LoraConversion add_lora(torch::nn::Module& model, const LoraOptions& options = {});

/// Initialises every adapter of `model` as torchtitan does: lora_a Kaiming-uniform with a = sqrt(5), i.e.
/// U(-1/sqrt(in), 1/sqrt(in)) over the whole input features, lora_b zeros. Values are drawn by the adapter's name and
/// the init seed (nn/init.hpp), so every layout starts alike; call it after parallelize and the base init.
void init_lora(torch::nn::Module& model);

/// Whether `fqn` names an adapter weight (ends in .lora_a.weight or .lora_b.weight).
bool is_lora_param(std::string_view fqn);

/// Whether `pattern` (a lora.target_modules entry) matches the module path `path` (see LoraOptions::target_modules).
bool lora_target_matches(std::string_view pattern, std::string_view path);

}  // namespace titan::nn
