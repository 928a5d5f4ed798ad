// SPDX-License-Identifier: BSD-3-Clause
// Private: the registry that maps a parameter (by TensorImpl) to what shards it. with_param() and
// sharded_param() look here; FSDP/DDP (and TP) bind their parameters at apply time.
#pragma once

#include <functional>

#include "titan/layout/sharded_param.hpp"

namespace titan::parallel::detail {

/// Whoever materialises bound parameters for layers (FSDP/DDP state, TP).
struct ParamHandler {
  virtual ~ParamHandler() = default;
  /// The tensor a layer computes with for parameter `index` of `unit`.
  virtual at::Tensor materialize(int64_t unit, int64_t index) = 0;
  /// Wraps a layer's output once it has used parameters of `unit` (backward pre-hook point).
  virtual at::Tensor after_use(int64_t unit, const at::Tensor& output) = 0;
};

struct Binding {
  ShardedParam info;               ///< global shape, placements, local region
  ParamHandler* handler = nullptr;  ///< who materialises it (null: sharded but used as is)
  int64_t unit = 0;                ///< handler's unit index
  int64_t index = 0;               ///< index within the unit
  /// Applied to the materialised tensor on every use (TP: e.g. a sequence-parallel norm weight's
  /// gradient all-reduce); kept when FSDP/DDP re-bind a TP parameter.
  std::function<at::Tensor(const at::Tensor&)> transform{};
};

/// Registers (or replaces) p's binding.
void bind_param(const at::Tensor& p, Binding binding);
void unbind_param(const at::Tensor& p);

}  // namespace titan::parallel::detail
