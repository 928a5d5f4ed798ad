// SPDX-License-Identifier: BSD-3-Clause
#include "titan/float8/converter.hpp"

#include <fmt/format.h>
#include <torch/nn/module.h>

#include <algorithm>

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/nn/layers.hpp"

namespace titan::float8 {
namespace {

constexpr std::string_view kAutoFilter = "auto_filter_small_kn";

// The matmul a converted Linear computes with; its type marks the Linear as converted.
struct ConvertedMatmul {
  Float8LinearConfig config{};
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& w, const parallel::WeightUse& use) const {
    return float8_linear(x, w, config, use);
  }
};

Recipe recipe_of(Float8Recipe r) {
  switch (r) {
    case Float8Recipe::tensorwise:
      return Recipe::kTensorwise;
    case Float8Recipe::rowwise:
      return Recipe::kRowwise;
    case Float8Recipe::rowwise_with_gw_hp:
      return Recipe::kRowwiseWithGwHp;
  }
  return Recipe::kTensorwise;
}

}  // namespace

Float8ConverterOptions converter_options(const Float8Config& config) {
  return {
      .config = {.recipe = recipe_of(config.recipe_name.value_or(Float8Recipe::tensorwise)), .emulate = config.emulate},
      .filter_fqns = config.filter_fqns};
}

std::optional<std::string> small_gemm_skip_reason(Recipe recipe, int64_t out_features, int64_t in_features) {
  const int64_t n = out_features;
  const int64_t k = in_features;
  // torchao 0.18's _auto_filter_for_tensorwise / _auto_filter_for_rowwise (H100 measurements).
  switch (recipe) {
    case Recipe::kTensorwise:
      if (k <= 4096 && n <= 1024) return fmt::format("auto_filter_small_kn: K {} <= 4096 and N {} <= 1024", k, n);
      return std::nullopt;
    case Recipe::kRowwise:
      if (n <= 2048) return fmt::format("auto_filter_small_kn: N {} <= 2048", n);
      if (k <= 1024) return fmt::format("auto_filter_small_kn: K {} <= 1024", k);
      if (n <= 4096 && k <= 2048) return fmt::format("auto_filter_small_kn: N {} <= 4096 and K {} <= 2048", n, k);
      return std::nullopt;
    case Recipe::kRowwiseWithGwHp:
      break;
  }
  TITAN_CHECK_VALUE(false,
                    "[titan::float8] expected recipe tensorwise or rowwise with auto_filter_small_kn, got {} (torchao "
                    "has no size thresholds for it). Name the Linears to skip in filter_fqns instead.",
                    recipe_name(recipe));
  return std::nullopt;
}

Float8Conversion convert_to_float8(torch::nn::Module& model, const Float8ConverterOptions& options) {
  const bool auto_filter =
      std::find(options.filter_fqns.begin(), options.filter_fqns.end(), kAutoFilter) != options.filter_fqns.end();
  std::vector<std::string> names;  // filter_fqns without the magic entry
  std::copy_if(options.filter_fqns.begin(), options.filter_fqns.end(), std::back_inserter(names),
               [](const std::string& f) { return f != kAutoFilter; });
  Float8Conversion report;
  std::vector<const nn::Linear*> adapters;  // found before themselves: a module comes before its children
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* linear = dynamic_cast<nn::Linear*>(item.value().get());
    if (linear == nullptr) continue;
    const std::string& fqn = item.key();
    if (linear->lora) adapters.insert(adapters.end(), {linear->lora->a.get(), linear->lora->b.get()});
    // A LoRA adapter stays in high precision, whichever converter ran first: its rank-wide GEMMs gain nothing from
    // float8, and PEFT computes it so.
    if (std::find(adapters.begin(), adapters.end(), linear) != adapters.end()) continue;
    const int64_t out = linear->weight.size(0);
    const int64_t in = linear->weight.size(1);
    std::optional<std::string> reason = float8_skip_reason(fqn, out, in, names);
    if (!reason && auto_filter) reason = small_gemm_skip_reason(options.config.recipe, out, in);
    if (reason) {
      log::info("float8: skipping {}: {}", fqn, *reason);
      report.skipped.emplace_back(fqn, *reason);
      continue;
    }
    linear->matmul = ConvertedMatmul{.config = options.config};
    report.converted.push_back(fqn);
  }
  log::info("float8: {} of {} Linear layers compute in float8 (recipe {}{})", report.converted.size(),
            report.converted.size() + report.skipped.size(), recipe_name(options.config.recipe),
            options.config.emulate ? ", emulated" : "");
  return report;
}

std::vector<std::string> fsdp_float8_weights(const torch::nn::Module& model) {
  std::vector<std::string> weights;
  auto& root = const_cast<torch::nn::Module&>(model);  // only read
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    auto* linear = dynamic_cast<nn::Linear*>(item.value().get());
    const ConvertedMatmul* f8 = linear == nullptr ? nullptr : linear->matmul.target<ConvertedMatmul>();
    if (f8 == nullptr) continue;
    TITAN_CHECK_VALUE(f8->config.recipe == Recipe::kTensorwise,
                      "[titan::float8] expected float8.enable_fsdp_float8_all_gather only with recipe_name "
                      "tensorwise, got {} for {} (torchao gathers tensorwise float8 weights only). Set "
                      "float8.enable_fsdp_float8_all_gather = false.",
                      recipe_name(f8->config.recipe), item.key());
    weights.push_back(item.key() + ".weight");
  }
  return weights;
}

}  // namespace titan::float8
