// SPDX-License-Identifier: BSD-3-Clause
// Enums with a name table: `TITAN_CHOICES(Enum, {Enum::a, "a"}, ...)` after an enum declares its
// spellings once; parsing (config files, the command line, --help, the JSON dump) and printing
// (`format_as`, so `fmt::format("{}", e)` prints the name) both read that one table. The config choices
// themselves are in core/choices.hpp.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace titan {

/// One row of a choice table: the enumerator and how users spell it.
template <class E>
struct ChoiceName {
  E value;
  std::string_view name;
};

/// An enum declared with TITAN_CHOICES (its table found by ADL on its namespace).
template <class E>
concept Choice = std::is_enum_v<E> && requires(E e) {
  { choice_names(e) } -> std::convertible_to<std::span<const ChoiceName<E>>>;
};

/// The spelling of `value` ("?" for a value outside the table, e.g. a cast integer).
template <Choice E>
constexpr std::string_view choice_name(E value) {
  for (const ChoiceName<E>& row : choice_names(E{})) {
    if (row.value == value) return row.name;
  }
  return "?";
}

/// The enumerator spelled `name`, or nothing.
template <Choice E>
constexpr std::optional<E> parse_choice(std::string_view name) {
  for (const ChoiceName<E>& row : choice_names(E{})) {
    if (row.name == name) return row.value;
  }
  return std::nullopt;
}

/// Every spelling, joined: "linear|sqrt|cosine".
template <Choice E>
std::string choice_list(std::string_view sep = "|") {
  std::string out;
  for (const ChoiceName<E>& row : choice_names(E{})) {
    if (!out.empty()) out += sep;
    out += row.name;
  }
  return out;
}

}  // namespace titan

/// Declares the name table of enum `Enum` (in Enum's namespace, after its definition) and its fmt
/// `format_as`. Rows are `{Enum::value, "spelling"}`; the first spelling of a value is the one printed.
#define TITAN_CHOICES(Enum, ...)                                                                                \
  inline constexpr ::titan::ChoiceName<Enum> titan_choice_table_##Enum[] = {__VA_ARGS__};                       \
  constexpr std::span<const ::titan::ChoiceName<Enum>> choice_names(Enum) { return titan_choice_table_##Enum; } \
  constexpr std::string_view format_as(Enum value) { return ::titan::choice_name(value); }
