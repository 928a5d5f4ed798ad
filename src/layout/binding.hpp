// SPDX-License-Identifier: BSD-3-Clause
// Private: the index from a parameter (by TensorImpl) to the binding that shards it. The bindings
// belong to the parallel state a parallelize() handle owns; the index only finds them. with_param()
// and sharded_param() look here.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "titan/layout/sharded_param.hpp"

namespace titan::parallel::detail {

/// Whoever materialises bound parameters for layers (FSDP/DDP state, TP).
struct ParamHandler {
  virtual ~ParamHandler() = default;
  /// The tensor a layer computes with for parameter `index` of `unit` (and its float8 form, if gathered so).
  virtual Materialized materialize(int64_t unit, int64_t index) = 0;
  /// Wraps a layer's output once it has used parameters of `unit` (backward pre-hook point).
  virtual at::Tensor after_use(int64_t unit, const at::Tensor& output) = 0;
};

/// The promises a parallelize() handle checks after the first backward: every parameter it bound
/// was read through with_param, every module its plan named ran through module_call.
struct Contract {
  virtual ~Contract() = default;
  /// Called from inside a backward pass that reached one of the handle's parameters.
  virtual void on_backward() = 0;
  /// Set by the first use under grad mode, which then routes through a probe node.
  std::atomic<bool> armed{false};
};

/// A flag copies of a Binding carry over (bindings are copied when FSDP re-binds a TP shard).
struct UseFlag {
  mutable std::atomic<bool> value{false};
  UseFlag() = default;
  UseFlag(const UseFlag& other) : value(other.value.load(std::memory_order_relaxed)) {}
  UseFlag& operator=(const UseFlag& other) {
    value.store(other.value.load(std::memory_order_relaxed), std::memory_order_relaxed);
    return *this;
  }
};

struct Binding {
  ShardedParam info;                ///< global shape, placements, local region
  ParamHandler* handler = nullptr;  ///< who materialises it (null: sharded but used as is)
  int64_t unit = 0;                 ///< handler's unit index
  int64_t index = 0;                ///< index within the unit
  /// Applied to the materialised tensor on every use (TP: e.g. a sequence-parallel norm weight's
  /// gradient all-reduce); kept when FSDP/DDP re-bind a TP parameter.
  std::function<at::Tensor(const at::Tensor&)> transform{};
  /// The handle's contract (null: none is checked).
  std::shared_ptr<Contract> contract{};
  /// Set on the first read through with_param.
  UseFlag used{};
  /// Non-empty once the handle that bound it is gone: every read is then this error.
  std::string orphaned{};
};

/// Registers (or replaces) p's binding.
void bind_param(const at::Tensor& p, Binding binding);
void unbind_param(const at::Tensor& p);
/// Makes p's binding report to contract (p must be bound).
void attach_contract(const at::Tensor& p, std::shared_ptr<Contract> contract);
/// Replaces p's binding by a tombstone: reading p through with_param is then an error whose message
/// is `why` (the model outlived its parallelize() handle). The index holds p's TensorImpl weakly, so
/// its address is never reused while the tombstone stands; tombstones of dead tensors are swept.
void orphan_param(const at::Tensor& p, std::string why);

}  // namespace titan::parallel::detail
