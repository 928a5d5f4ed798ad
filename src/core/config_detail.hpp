// SPDX-License-Identifier: BSD-3-Clause
// Private to src/core/config*.cpp: the error helpers, key lookup and the per-type value conversions
// (JSON value or command-line text -> field) shared by the file and CLI layers.
#pragma once

#include "titan/core/config.hpp"
#include "titan/core/config_loader.hpp"

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace titan::config_detail {

using nlohmann::json;

/// Throws ConfigError(key, "[titan::config] " + message).
[[noreturn]] void fail(std::string key, std::string_view message);

inline constexpr std::string_view kCommandLine = "the command line";

/// Where a value came from, for error messages: the key as the user wrote it and its source.
struct Where {
  std::string_view key;
  std::string_view origin;  // "run.toml", "the command line", ...
};

[[noreturn]] void type_error(Where where, std::string_view expected, std::string_view got);

/// Maps what users may write to the schema's key: `-` to `_`, torchtitan's quantize.linear.float8 to float8.
std::string canonical_key(std::string_view key);

/// Throws the unknown-key error with the closest existing key as a suggestion.
[[noreturn]] void unknown_key(std::string_view key, std::string_view origin);

/// True when `key` names a table of the schema (a section, training.dataloader, quantize.linear, ...).
bool is_table_key(std::string_view canonical);

/// The note for a key in a section titan recognises but has no fields for (fault_tolerance, ...), or
/// nothing when the key lies elsewhere. Defined beside the support table.
std::optional<std::string> recognised_unsupported_note(std::string_view canonical, std::string_view value);
bool is_recognised_unsupported_table(std::string_view canonical);
/// Those sections, for --help.
std::vector<std::string_view> recognised_unsupported_sections();

/// Calls visit(value) on the field named `canonical`; false when there is no such field.
template <class Visitor>
bool visit_key(JobConfig& config, std::string_view canonical, Visitor&& visit) {
  bool found = false;
  detail::for_each_leaf(config, "", [&](std::string_view key, std::string_view, std::string_view, auto& value) {
    if (!found && key == canonical) {
      visit(value);
      found = true;
    }
  });
  return found;
}

/// True when `canonical` is a field of the schema.
bool is_known_key(std::string_view canonical);

/// `training.steps` -> `/training/steps`.
json::json_pointer pointer_of(std::string_view dotted_key);

/// Adds `note` once.
void add_note(ConfigNotes* notes, std::string note);

// ---- per-type conversions ------------------------------------------------------------------------

template <class T>
struct Tag {};

inline std::string type_name(Tag<int64_t>) { return "int"; }
inline std::string type_name(Tag<double>) { return "float"; }
inline std::string type_name(Tag<bool>) { return "bool"; }
inline std::string type_name(Tag<std::string>) { return "str"; }
inline std::string type_name(Tag<std::vector<std::string>>) { return "list[str]"; }
inline std::string type_name(Tag<std::vector<double>>) { return "list[float]"; }
inline std::string type_name(Tag<std::vector<std::vector<std::string>>>) { return "list[list[str]]"; }
template <Choice E>
std::string type_name(Tag<E>) {
  return choice_list<E>();
}
template <class T>
std::string type_name(Tag<std::optional<T>>) {
  return type_name(Tag<T>{}) + "|None";
}

inline std::string expectation(Tag<int64_t>) { return "an integer"; }
inline std::string expectation(Tag<double>) { return "a number"; }
inline std::string expectation(Tag<bool>) { return "true or false"; }
inline std::string expectation(Tag<std::string>) { return "a string"; }
inline std::string expectation(Tag<std::vector<std::string>>) { return "a list of strings"; }
inline std::string expectation(Tag<std::vector<double>>) { return "a list of numbers"; }
inline std::string expectation(Tag<std::vector<std::vector<std::string>>>) { return "a list of lists of strings"; }
template <Choice E>
std::string expectation(Tag<E>) {
  return "one of " + choice_list<E>();
}
template <class T>
std::string expectation(Tag<std::optional<T>>) {
  return expectation(Tag<T>{}) + " or null";
}

inline json to_json_value(const int64_t& v) { return v; }
inline json to_json_value(const double& v) { return v; }
inline json to_json_value(const bool& v) { return v; }
inline json to_json_value(const std::string& v) { return v; }
inline json to_json_value(const std::vector<std::string>& v) { return v; }
inline json to_json_value(const std::vector<double>& v) { return v; }
inline json to_json_value(const std::vector<std::vector<std::string>>& v) { return v; }
template <Choice E>
json to_json_value(const E& v) {
  return std::string(choice_name(v));
}
template <class T>
json to_json_value(const std::optional<T>& v) {
  return v ? to_json_value(*v) : json(nullptr);
}

/// Splits on `sep` and trims spaces; "" gives an empty list (so `--model.converters ""` clears it).
std::vector<std::string> split_list(std::string_view text, char sep);
/// true/false/True/False/1/0/yes/no, or nothing.
std::optional<bool> parse_bool(std::string_view text);
/// The text as a quoted JSON string, for messages.
std::string quoted(std::string_view text);

// From a JSON value (TOML files are converted to JSON first).
void from_json_value(int64_t& out, const json& j, Where where);
void from_json_value(double& out, const json& j, Where where);
void from_json_value(bool& out, const json& j, Where where);
void from_json_value(std::string& out, const json& j, Where where);
void from_json_value(std::vector<std::string>& out, const json& j, Where where);
void from_json_value(std::vector<double>& out, const json& j, Where where);
void from_json_value(std::vector<std::vector<std::string>>& out, const json& j, Where where);
/// A choice is spelled as in its table; anything else names the key, the value and the choices.
template <Choice E>
void from_json_value(E& out, const json& j, Where where) {
  const std::optional<E> value = j.is_string() ? parse_choice<E>(j.get<std::string>()) : std::nullopt;
  if (!value) type_error(where, expectation(Tag<E>{}), j.dump());
  out = *value;
}
template <class T>
void from_json_value(std::optional<T>& out, const json& j, Where where) {
  if (j.is_null()) {
    out.reset();
    return;
  }
  T value = out.value_or(T{});
  from_json_value(value, j, where);
  out = std::move(value);
}

// From command-line text.
void from_text(int64_t& out, std::string_view text, Where where);
void from_text(double& out, std::string_view text, Where where);
void from_text(bool& out, std::string_view text, Where where);
void from_text(std::string& out, std::string_view text, Where where);
void from_text(std::vector<std::string>& out, std::string_view text, Where where);
void from_text(std::vector<double>& out, std::string_view text, Where where);
void from_text(std::vector<std::vector<std::string>>& out, std::string_view text, Where where);
template <Choice E>
void from_text(E& out, std::string_view text, Where where) {
  const std::optional<E> value = parse_choice<E>(text);
  if (!value) type_error(where, expectation(Tag<E>{}), quoted(text));
  out = *value;
}
template <class T>
void from_text(std::optional<T>& out, std::string_view text, Where where) {
  if (text == "None" || text == "null") {
    out.reset();
    return;
  }
  T value = out.value_or(T{});
  from_text(value, text, where);
  out = std::move(value);
}

}  // namespace titan::config_detail
