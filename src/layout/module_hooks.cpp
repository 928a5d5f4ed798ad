// SPDX-License-Identifier: BSD-3-Clause
#include "titan/layout/module_hooks.hpp"

#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include "attachments.hpp"

namespace titan::parallel::detail {

std::atomic<int64_t> hooked_modules{0};

namespace {
using WeakModule = std::weak_ptr<const torch::nn::Module>;
Attachments<torch::nn::Module, WeakModule, const ModuleHook>& hooks() {
  static Attachments<torch::nn::Module, WeakModule, const ModuleHook> index(hooked_modules);
  return index;
}
}  // namespace

std::weak_ptr<const torch::nn::Module> shared_owner(const torch::nn::Module& module, const std::string& path) {
  try {
    return const_cast<torch::nn::Module&>(module).shared_from_this();
  } catch (const std::bad_weak_ptr&) {
    TORCH_CHECK(false, "[titan::parallel] expected module '", path.empty() ? "<root>" : path,
                "' to be held by a std::shared_ptr, got one that is not (on the stack or in a unique_ptr): a "
                "parallel style or checkpoint mark is found by the module's address and must know when the module "
                "dies. Build the model with std::make_shared (submodules: register_module).");
  }
}

const ModuleHook* find_module_hook(const torch::nn::Module* module) { return hooks().find(module); }

void set_module_hook(const torch::nn::Module& module, const std::string& path, std::shared_ptr<const ModuleHook> hook) {
  hooks().attach(&module, shared_owner(module, path), std::move(hook));
}

void remove_module_hook(const torch::nn::Module* module, const ModuleHook* hook) { hooks().detach(module, hook); }

}  // namespace titan::parallel::detail
