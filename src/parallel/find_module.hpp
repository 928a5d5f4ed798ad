// SPDX-License-Identifier: BSD-3-Clause
// Private: a plan's module path -> the module, with the error every plan section gives.
#pragma once

#include <torch/nn/module.h>

#include <algorithm>
#include <string>

#include "titan/core/error.hpp"

namespace titan::parallel::detail {

/// Whether the parameter or module `name` is the module at `path` or lies under it ("layers.1.w" under "layers.1",
/// not under "layers.10").
inline bool is_under(const std::string& name, const std::string& path) {
  return name == path || (name.size() > path.size() && name.starts_with(path) && name[path.size()] == '.');
}

/// The submodule at `path` ("" names the root); `section` names the plan section in the error. It walks the
/// path's names down the children (a submodule's name has no dot), not the whole tree: a plan names every
/// module of a model, and a planner applies plans by the dozen.
inline torch::nn::Module& find_module(torch::nn::Module& model, const std::string& path, const char* section) {
  torch::nn::Module* module = &model;
  for (size_t begin = 0; module != nullptr && begin < path.size();) {
    const size_t end = std::min(path.find('.', begin), path.size());
    const auto children = module->named_children();
    const auto* child = children.find(path.substr(begin, end - begin));
    module = child == nullptr ? nullptr : child->get();
    begin = end + 1;
  }
  TITAN_CHECK_VALUE(module != nullptr && !path.ends_with('.'),
                    "[titan::parallelize] expected plan.{} path '{}' to name a submodule, got no "
                    "such module. Check the path against the model's named_modules().",
                    section, path);
  return *module;
}

}  // namespace titan::parallel::detail
