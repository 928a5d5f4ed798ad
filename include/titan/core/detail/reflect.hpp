// SPDX-License-Identifier: BSD-3-Clause
// Field reflection for config structs: `TITAN_CONFIG(Type, a, b, c)` lists a struct's fields once, and
// that one list drives file loading, CLI overrides, --help and the JSON dump (see core/config.hpp).
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

// TITAN_DETAIL_FOR_EACH(m, a, b, c) -> m(a) m(b) m(c), for up to 256 arguments (C++20 __VA_OPT__).
#define TITAN_DETAIL_PARENS ()
#define TITAN_DETAIL_EXPAND(...) \
  TITAN_DETAIL_EXPAND3(TITAN_DETAIL_EXPAND3(TITAN_DETAIL_EXPAND3(TITAN_DETAIL_EXPAND3(__VA_ARGS__))))
#define TITAN_DETAIL_EXPAND3(...) \
  TITAN_DETAIL_EXPAND2(TITAN_DETAIL_EXPAND2(TITAN_DETAIL_EXPAND2(TITAN_DETAIL_EXPAND2(__VA_ARGS__))))
#define TITAN_DETAIL_EXPAND2(...) \
  TITAN_DETAIL_EXPAND1(TITAN_DETAIL_EXPAND1(TITAN_DETAIL_EXPAND1(TITAN_DETAIL_EXPAND1(__VA_ARGS__))))
#define TITAN_DETAIL_EXPAND1(...) __VA_ARGS__
#define TITAN_DETAIL_FOR_EACH(macro, ...) \
  __VA_OPT__(TITAN_DETAIL_EXPAND(TITAN_DETAIL_FOR_EACH_HELPER(macro, __VA_ARGS__)))
#define TITAN_DETAIL_FOR_EACH_HELPER(macro, a1, ...) \
  macro(a1) __VA_OPT__(TITAN_DETAIL_FOR_EACH_AGAIN TITAN_DETAIL_PARENS(macro, __VA_ARGS__))
#define TITAN_DETAIL_FOR_EACH_AGAIN() TITAN_DETAIL_FOR_EACH_HELPER

#define TITAN_DETAIL_VISIT_FIELD(name) visit(std::string_view(#name), self.name);

/// Declares the reflected fields of config struct `Type` (in Type's namespace, after its definition):
/// `for_each_field(obj, [](std::string_view name, auto& value) {...})` then visits them in order.
#define TITAN_CONFIG(Type, ...)                                      \
  template <class Visitor>                                           \
  constexpr void for_each_field(Type& self, Visitor&& visit) {       \
    TITAN_DETAIL_FOR_EACH(TITAN_DETAIL_VISIT_FIELD, __VA_ARGS__)     \
  }                                                                  \
  template <class Visitor>                                           \
  constexpr void for_each_field(const Type& self, Visitor&& visit) { \
    TITAN_DETAIL_FOR_EACH(TITAN_DETAIL_VISIT_FIELD, __VA_ARGS__)     \
  }                                                                  \
  constexpr std::string_view reflected_name(const Type*) noexcept { return #Type; }

namespace titan::detail {

/// A struct declared with TITAN_CONFIG (found by ADL on its namespace).
template <class T>
concept Reflected = requires {
  reflected_name(static_cast<const std::remove_cvref_t<T>*>(nullptr));
};

/// Visits every leaf (non-struct) field below `node` as `visit(dotted_key, struct_name, field, value)`:
/// nested reflected structs become dotted prefixes, so JobConfig yields `training.dataloader.num_workers`.
template <Reflected Node, class Visitor>
void for_each_leaf(Node& node, const std::string& prefix, Visitor&& visit) {
  const std::string_view owner = reflected_name(static_cast<const std::remove_cvref_t<Node>*>(nullptr));
  for_each_field(node, [&](std::string_view field, auto& value) {
    std::string key = prefix.empty() ? std::string(field) : prefix + "." + std::string(field);
    if constexpr (Reflected<decltype(value)>) {
      for_each_leaf(value, key, visit);
    } else {
      visit(std::string_view(key), owner, field, value);
    }
  });
}

}  // namespace titan::detail
