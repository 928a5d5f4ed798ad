// SPDX-License-Identifier: BSD-3-Clause
// The float8 model converter (torchtitan's quantize.linear.float8, torchao's convert_to_float8_training):
// every eligible titan::nn::Linear of a model computes its matmul with Float8Linear's GEMMs from then on,
// keeping its weight, its name and its place in the parallel plan. See docs/float8.md.
//
// Example:
//   const auto report = titan::float8::convert_to_float8(model, {.config = {.recipe = Recipe::kRowwise},
//                                                                .filter_fqns = {"output"}});
//   // report.converted: {"layers.0.attention.wq", ...}; report.skipped: {{"output", "its name contains ..."}}
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "titan/float8/linear.hpp"

namespace torch::nn {
class Module;
}

namespace titan {
struct Float8Config;
}

namespace titan::float8 {

/// What convert_to_float8 converts, and how the converted Linears compute.
struct Float8ConverterOptions {
  /// recipe and emulation of the converted Linears
  Float8LinearConfig config{};
  /// Linears whose name contains one of these stay high precision; the entry auto_filter_small_kn
  /// also skips GEMMs too small to gain from float8 (torchao's thresholds for the recipe)
  std::vector<std::string> filter_fqns{};
};

/// The options [float8] ([quantize.linear.float8]) describes: recipe_name (unset = tensorwise),
/// emulate, filter_fqns.
Float8ConverterOptions converter_options(const Float8Config& config);

/// What a conversion did, by module path.
struct Float8Conversion {
  std::vector<std::string> converted{};                        ///< Linears now computing in float8
  std::vector<std::pair<std::string, std::string>> skipped{};  ///< (path, why) of the Linears left alone
};

/// torchao's size filter (auto_filter_small_kn) for a weight (out = N, in = K): why float8 would not
/// pay for this GEMM under `recipe`, or nullopt. Throws for rowwise_with_gw_hp (torchao has no thresholds).
std::optional<std::string> small_gemm_skip_reason(Recipe recipe, int64_t out_features, int64_t in_features);

/// Converts model's eligible titan::nn::Linear modules (both weight dims divisible by 16, not filtered)
/// in place: their forward runs float8_linear(x, w, options.config). Logs each skipped Linear with its
/// reason and a summary line. A Linear converted before is converted again with the new options.
Float8Conversion convert_to_float8(torch::nn::Module& model, const Float8ConverterOptions& options = {});

/// The weights FSDP all-gathers in float8 under float8.enable_fsdp_float8_all_gather: those of the
/// Linears convert_to_float8 converted (for DataParallelOptions::float8_all_gather). Throws naming the
/// key for a Linear converted with a recipe other than tensorwise.
std::vector<std::string> fsdp_float8_weights(const torch::nn::Module& model);

}  // namespace titan::float8
