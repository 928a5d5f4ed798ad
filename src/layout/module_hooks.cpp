// SPDX-License-Identifier: BSD-3-Clause
#include "titan/layout/module_hooks.hpp"

#include <shared_mutex>
#include <unordered_map>

namespace titan::parallel::detail {

std::atomic<int64_t> hooked_modules{0};

namespace {
// Shared by ranks-as-threads (each hooks its own model's modules); lookups take a shared lock.
struct HookRegistry {
  std::shared_mutex mutex;
  std::unordered_map<const torch::nn::Module*, std::shared_ptr<const ModuleHook>> hooks;
};
HookRegistry& hook_registry() {
  static HookRegistry r;
  return r;
}
}  // namespace

const ModuleHook* find_module_hook(const torch::nn::Module* module) {
  HookRegistry& r = hook_registry();
  std::shared_lock lock(r.mutex);
  auto it = r.hooks.find(module);
  return it == r.hooks.end() ? nullptr : it->second.get();
}

void set_module_hook(const torch::nn::Module* module, std::shared_ptr<const ModuleHook> hook) {
  HookRegistry& r = hook_registry();
  std::unique_lock lock(r.mutex);
  if (r.hooks.insert_or_assign(module, std::move(hook)).second) ++hooked_modules;
}

void remove_module_hook(const torch::nn::Module* module) {
  HookRegistry& r = hook_registry();
  std::unique_lock lock(r.mutex);
  if (r.hooks.erase(module) > 0) --hooked_modules;
}

}  // namespace titan::parallel::detail
