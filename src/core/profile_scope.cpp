// SPDX-License-Identifier: BSD-3-Clause
#include "titan/core/profile_scope.hpp"

#include <ATen/record_function.h>

#include <string>

namespace titan {

ProfileScope::ProfileScope(std::string_view name, std::string_view suffix) {
  if (!at::hasCallbacks()) return;  // no profiler (or other observer) anywhere: no allocation, no name
  auto range = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (!range->isActive()) return;
  std::string full;
  full.reserve(name.size() + suffix.size());
  full.append(name).append(suffix);
  range->before(std::string_view(full));  // copied into the range
  range_ = std::move(range);
}

ProfileScope::~ProfileScope() = default;  // RecordFunction's destructor ends the range

}  // namespace titan
