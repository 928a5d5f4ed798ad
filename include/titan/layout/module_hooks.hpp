// SPDX-License-Identifier: BSD-3-Clause
// The point where a parallel style meets a module's forward. Tensor parallelism changes what goes
// into and comes out of a module (gather the sequence, reduce a partial sum, mask a vocabulary
// shard); the module's own math stays as written. titan's layers (Linear, Embedding, RMSNorm,
// Attention, FeedForward) run their forward through module_call(); a user's module that a
// ParallelPlan names does the same:
//
//   at::Tensor MyBlock::forward(const at::Tensor& x) const {
//     return titan::parallel::module_call(*this, x, [&](const at::Tensor& in) { return proj->forward(in); });
//   }
//
// With no style applied anywhere it is one relaxed atomic load and a direct call.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/FunctionRef.h>

#include <atomic>
#include <memory>
#include <string>

namespace torch::nn {
class Module;
}

namespace titan::parallel {

namespace detail {
/// What a style does around a module's forward.
struct ModuleHook {
  virtual ~ModuleHook() = default;
  /// Redistributes x, runs the module's math (inner) and redistributes its output.
  virtual at::Tensor call(const at::Tensor& x, c10::function_ref<at::Tensor(const at::Tensor&)> inner) const = 0;
  /// Set by the first module_call: a module named by a plan that never runs through module_call is
  /// reported by the plan's contract check.
  mutable std::atomic<bool> ran{false};
};
extern std::atomic<int64_t> hooked_modules;
const ModuleHook* find_module_hook(const torch::nn::Module* module);
/// Attaches hook to module (path names it in errors; the module must be held by a std::shared_ptr).
void set_module_hook(const torch::nn::Module& module, const std::string& path, std::shared_ptr<const ModuleHook> hook);
/// Removes module's hook if it is still `hook` (the caller's), not one a later handle attached.
void remove_module_hook(const torch::nn::Module* module, const ModuleHook* hook);
/// module's shared owner, for an index entry that must not outlive it; throws naming path when the module is
/// not held by a std::shared_ptr.
std::weak_ptr<const torch::nn::Module> shared_owner(const torch::nn::Module& module, const std::string& path);
}  // namespace detail

/// Runs f(x) as module's forward under the style applied to module (if any).
template <class F>
at::Tensor module_call(const torch::nn::Module& module, const at::Tensor& x, F&& f) {
  if (detail::hooked_modules.load(std::memory_order_relaxed) == 0) return f(x);
  const detail::ModuleHook* hook = detail::find_module_hook(&module);
  if (hook == nullptr) return f(x);
  hook->ran.store(true, std::memory_order_relaxed);
  return hook->call(x, f);
}

}  // namespace titan::parallel
