// SPDX-License-Identifier: BSD-3-Clause
// Float8Linear: y = x W^T whose three GEMMs (output, input gradient, weight gradient) run on float8
// operands with dynamic scales (amax -> scale -> saturated cast, float8::cast), in torchao's recipes
// (tensorwise, rowwise, rowwise_with_gw_hp). See docs/float8.md for the numerics and the oracle test.
//
// Example:
//   titan::float8::Float8Linear proj(4096, 1024, at::kFloat, {.recipe = titan::float8::Recipe::kRowwise});
//   at::Tensor y = proj.forward(x);  // (..., 4096) -> (..., 1024)
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "titan/layout/shardable.hpp"
#include "titan/layout/sharded_param.hpp"

namespace titan::dist {
class ProcessGroup;
}

namespace titan::float8 {

/// torchao's float8 training recipes (Float8LinearRecipeName).
enum class Recipe {
  kTensorwise,       ///< one scale per tensor; e4m3 input and weight, e5m2 gradients (torchao's default)
  kRowwise,          ///< one scale per GEMM row/column; e4m3 everywhere; power-of-2 scales
  kRowwiseWithGwHp,  ///< rowwise, but grad_input uses a tensorwise weight and grad_weight stays high precision
};

/// "tensorwise", "rowwise", "rowwise_with_gw_hp".
std::string_view recipe_name(Recipe recipe);
/// The recipe of a torchao recipe name; throws naming the valid ones.
Recipe recipe_from_name(std::string_view name);

/// How a Float8Linear computes.
struct Float8LinearConfig {
  /// scaling recipe (torchao's recipe_name): tensorwise, rowwise or rowwise_with_gw_hp
  Recipe recipe = Recipe::kTensorwise;
  /// run each float8 GEMM as dequantize + high-precision GEMM instead of at::_scaled_mm (torchao's emulate)
  bool emulate = false;
};

/// y = x w^T with float8 GEMMs in forward and backward (differentiable in x and w).
/// x (..., K), w (N, K) -> (..., N). Tensorwise GEMMs go through at::_scaled_mm unless emulated;
/// rowwise ones are emulated on CPU (at::_scaled_mm supports only tensorwise scales there). Under autocast
/// on x's device, x is cast to the autocast dtype first and the output is in that dtype (torchao's).
/// `use`: w's float8 form when FSDP gathered it so (tensorwise only), and the tensor-parallel group w
/// is a shard over: tensorwise casts of each operand (input, weight, and in backward grad_output) then
/// take the amax of the whole tensor, all-reduced (MAX) over it, so shards get the bytes one device
/// would (torchao's Float8ColwiseParallel / Float8RowwiseParallel scales).
at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& w, const Float8LinearConfig& config,
                         const parallel::WeightUse& use = {});

/// A bias-free Linear (as titan::nn::Linear) whose matmuls run in float8.
class Float8Linear : public torch::nn::Module, public parallel::ShardableLayer {
 public:
  Float8Linear(int64_t in_features, int64_t out_features, const at::TensorOptions& options,
               Float8LinearConfig config = {});
  at::Tensor forward(const at::Tensor& x) const;  // (..., in) -> (..., out)
  Role shardable_role() const override { return Role::kLinear; }
  at::Tensor& shardable_weight() override { return weight; }

  at::Tensor weight;  // (out_features, in_features)
  Float8LinearConfig config{};
};

/// Why torchtitan's float8 converter leaves the Linear at `fqn` (weight (out, in)) in high precision,
/// or nullopt when it converts it: both dims must be divisible by 16 (float8 tensor-core GEMMs), and
/// no entry of `filter_fqns` may be a substring of `fqn`.
std::optional<std::string> float8_skip_reason(std::string_view fqn, int64_t out_features, int64_t in_features,
                                              const std::vector<std::string>& filter_fqns = {});
/// float8_skip_reason() == nullopt; a skipped Linear is logged (info) with its reason.
bool should_convert_to_float8(std::string_view fqn, int64_t out_features, int64_t in_features,
                              const std::vector<std::string>& filter_fqns = {});

}  // namespace titan::float8
