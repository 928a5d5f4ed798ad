// SPDX-License-Identifier: BSD-3-Clause
// Private: a plan's module path -> the module, with the error every plan section gives.
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "titan/core/error.hpp"

namespace titan::parallel::detail {

/// The submodule at `path` ("" names the root); `section` names the plan section in the error.
inline torch::nn::Module& find_module(torch::nn::Module& model, const std::string& path, const char* section) {
  if (path.empty()) return model;
  const auto modules = model.named_modules("", /*include_self=*/false);
  TITAN_CHECK_VALUE(modules.contains(path),
                    "[titan::parallelize] expected plan.{} path '{}' to name a submodule, got no "
                    "such module. Check the path against the model's named_modules().",
                    section, path);
  return *modules[path];
}

}  // namespace titan::parallel::detail
