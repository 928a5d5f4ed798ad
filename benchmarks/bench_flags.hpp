// SPDX-License-Identifier: BSD-3-Clause
// "--name value" command lines for the benchmarks: each flag names the field it sets.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "titan/core/error.hpp"

namespace titan::bench {

/// string, integer, boolean (1/true/0/false, or the flag alone for true) or comma-separated integers.
using FlagTarget = std::variant<std::string*, int64_t*, bool*, std::vector<int64_t>*>;

inline void parse_flags(int argc, char** argv, const char* program,
                        const std::vector<std::pair<std::string, FlagTarget>>& flags) {
  for (int i = 1; i < argc; i += 2) {
    const std::string key = argv[i];
    auto it = std::find_if(flags.begin(), flags.end(), [&](const auto& f) { return f.first == key; });
    // A boolean flag alone (last, or followed by another flag) is true: `--dry-run`.
    if (it != flags.end() && std::holds_alternative<bool*>(it->second) &&
        (i + 1 == argc || std::string_view(argv[i + 1]).starts_with("--"))) {
      *std::get<bool*>(it->second) = true;
      --i;
      continue;
    }
    std::vector<std::string> names;
    for (const auto& f : flags) names.push_back(f.first);
    TITAN_CHECK_VALUE(it != flags.end() && i + 1 < argc, "[{}] expected one of {} followed by a value, got '{}'.",
                      program, fmt::join(names, "|"), key);
    const std::string value = argv[i + 1];
    std::visit(
        [&](auto* target) {
          using T = std::remove_pointer_t<decltype(target)>;
          if constexpr (std::is_same_v<T, std::string>) {
            *target = value;
          } else if constexpr (std::is_same_v<T, int64_t>) {
            *target = std::stoll(value);
          } else if constexpr (std::is_same_v<T, bool>) {
            *target = value == "1" || value == "true";
          } else {
            target->clear();
            std::stringstream ss(value);
            for (std::string item; std::getline(ss, item, ',');) target->push_back(std::stoll(item));
          }
        },
        it->second);
  }
}

}  // namespace titan::bench
