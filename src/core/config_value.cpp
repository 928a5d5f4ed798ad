// SPDX-License-Identifier: BSD-3-Clause
// Value conversions for config fields: JSON values (TOML goes through JSON) and command-line text, each
// failing with the key, the expected type and the value that was given.
#include "config_detail.hpp"

#include <fmt/format.h>

#include <limits>

namespace titan::config_detail {

void type_error(Where where, std::string_view expected, std::string_view got) {
  fail(std::string(where.key),
       fmt::format("{} expects {}, got {} in {}. Fix the value; --help lists every key with its type.", where.key,
                   expected, got, where.origin));
}

std::vector<std::string> split_list(std::string_view text, char sep) {
  std::vector<std::string> items;
  if (text.find_first_not_of(' ') == std::string_view::npos) return items;
  size_t begin = 0;
  while (true) {
    const size_t end = text.find(sep, begin);
    std::string_view item = text.substr(begin, end == std::string_view::npos ? text.npos : end - begin);
    const size_t first = item.find_first_not_of(' ');
    const size_t last = item.find_last_not_of(' ');
    items.emplace_back(first == std::string_view::npos ? std::string_view() : item.substr(first, last - first + 1));
    if (end == std::string_view::npos) break;
    begin = end + 1;
  }
  return items;
}

std::optional<bool> parse_bool(std::string_view text) {
  if (text == "true" || text == "True" || text == "1" || text == "yes") return true;
  if (text == "false" || text == "False" || text == "0" || text == "no") return false;
  return std::nullopt;
}

std::string quoted(std::string_view text) { return json(std::string(text)).dump(); }

// ---- JSON ----------------------------------------------------------------------------------------

void from_json_value(int64_t& out, const json& j, Where where) {
  if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
    type_error(where, "an integer that fits in int64", j.dump());
  }
  if (j.is_number_integer()) {
    out = j.get<int64_t>();
    return;
  }
  // 1e3 is an integer to a human; 1.5 is not.
  if (j.is_number_float()) {
    const double d = j.get<double>();
    if (std::isfinite(d) && std::trunc(d) == d && std::fabs(d) < 9.2e18) {
      out = static_cast<int64_t>(d);
      return;
    }
  }
  type_error(where, "an integer", j.dump());
}

void from_json_value(double& out, const json& j, Where where) {
  if (!j.is_number()) type_error(where, "a number", j.dump());
  out = j.get<double>();
}

void from_json_value(bool& out, const json& j, Where where) {
  if (!j.is_boolean()) type_error(where, "true or false", j.dump());
  out = j.get<bool>();
}

void from_json_value(std::string& out, const json& j, Where where) {
  if (!j.is_string()) type_error(where, "a string", j.dump());
  out = j.get<std::string>();
}

void from_json_value(std::vector<std::string>& out, const json& j, Where where) {
  // A string is a comma-separated list, as on the command line.
  if (j.is_string()) {
    out = split_list(j.get<std::string>(), ',');
    return;
  }
  if (!j.is_array()) type_error(where, "a list of strings", j.dump());
  std::vector<std::string> items;
  for (const json& item : j) {
    if (!item.is_string()) type_error(where, "a list of strings", j.dump());
    items.push_back(item.get<std::string>());
  }
  out = std::move(items);
}

void from_json_value(std::vector<double>& out, const json& j, Where where) {
  if (!j.is_array()) type_error(where, "a list of numbers", j.dump());
  std::vector<double> items;
  for (const json& item : j) {
    if (!item.is_number()) type_error(where, "a list of numbers", j.dump());
    items.push_back(item.get<double>());
  }
  out = std::move(items);
}

void from_json_value(std::vector<std::vector<std::string>>& out, const json& j, Where where) {
  if (!j.is_array()) type_error(where, "a list of lists of strings", j.dump());
  std::vector<std::vector<std::string>> parts;
  for (const json& part : j) {
    if (!part.is_array()) type_error(where, "a list of lists of strings", j.dump());
    from_json_value(parts.emplace_back(), part, where);
  }
  out = std::move(parts);
}

// ---- command-line text ---------------------------------------------------------------------------

namespace {

template <class Number>
bool parse_number(std::string_view text, Number& out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && !text.empty();
}

// `[...]` on the command line is JSON, for lists that commas cannot express.
bool from_json_text(auto& out, std::string_view text, Where where) {
  if (text.empty() || text.front() != '[') return false;
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) type_error(where, "a JSON list (the value starts with '[')", quoted(text));
  from_json_value(out, j, where);
  return true;
}

}  // namespace

void from_text(int64_t& out, std::string_view text, Where where) {
  if (!parse_number(text, out)) type_error(where, "an integer", quoted(text));
}

void from_text(double& out, std::string_view text, Where where) {
  if (!parse_number(text, out)) type_error(where, "a number", quoted(text));
}

void from_text(bool& out, std::string_view text, Where where) {
  const std::optional<bool> b = parse_bool(text);
  if (!b) type_error(where, "true or false", quoted(text));
  out = *b;
}

void from_text(std::string& out, std::string_view text, Where) { out = std::string(text); }

void from_text(std::vector<std::string>& out, std::string_view text, Where where) {
  if (!from_json_text(out, text, where)) out = split_list(text, ',');
}

void from_text(std::vector<double>& out, std::string_view text, Where where) {
  if (from_json_text(out, text, where)) return;
  std::vector<double> items;
  for (const std::string& item : split_list(text, ',')) {
    if (!parse_number(std::string_view(item), items.emplace_back()))
      type_error(where, "a list of numbers", quoted(text));
  }
  out = std::move(items);
}

void from_text(std::vector<std::vector<std::string>>& out, std::string_view text, Where where) {
  if (from_json_text(out, text, where)) return;
  // "a,b;c" = [["a","b"],["c"]]: one part per ';'.
  std::vector<std::vector<std::string>> parts;
  for (const std::string& part : split_list(text, ';')) parts.push_back(split_list(part, ','));
  out = std::move(parts);
}

}  // namespace titan::config_detail
