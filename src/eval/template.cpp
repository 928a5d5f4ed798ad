// SPDX-License-Identifier: BSD-3-Clause
#include "template.hpp"

#include <cctype>
#include <cmath>

#include "titan/core/error.hpp"

namespace titan::eval::detail {
namespace {

std::string_view trim_expression(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\n") - b + 1);
}

[[noreturn]] void unsupported(const TemplateSite& site, std::string_view what) {
  throw c10::ValueError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                        fmt::format("[titan::eval] {}: {}: expected Jinja of the form {{{{ field }}}}, "
                                    "{{{{ field.name }}}}, {{{{ field[0] }}}} or {{{{ field['name'] }}}}, got {}. "
                                    "titan-eval does not run filters, calls or statements: precompute the text as a "
                                    "field of the data file.",
                                    site.file, site.key, what));
}

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

// The value `path` ("choices.text", "answers[0]", "meta['label']") names in doc.
const nlohmann::ordered_json& lookup(std::string_view path, const nlohmann::ordered_json& doc,
                                     const TemplateSite& site) {
  const std::string where(path);
  const nlohmann::ordered_json* value = &doc;
  size_t i = 0;
  bool first = true;
  while (i < path.size()) {
    std::string key;
    std::optional<int64_t> index;
    if (first || path[i] == '.') {
      i += first ? 0 : 1;
      const size_t begin = i;
      while (i < path.size() && name_char(path[i])) ++i;
      if (i == begin) unsupported(site, fmt::format("'{{{{ {} }}}}'", where));
      key = std::string(path.substr(begin, i - begin));
    } else if (path[i] == '[') {
      const size_t close = path.find(']', i);
      if (close == std::string_view::npos) unsupported(site, fmt::format("'{{{{ {} }}}}'", where));
      const std::string_view inside = trim_expression(path.substr(i + 1, close - i - 1));
      i = close + 1;
      if (inside.size() >= 2 && (inside[0] == '\'' || inside[0] == '"') && inside.back() == inside[0]) {
        key = std::string(inside.substr(1, inside.size() - 2));
      } else {
        int64_t n = 0;
        for (const char c : inside) {
          if (!std::isdigit(static_cast<unsigned char>(c))) unsupported(site, fmt::format("'{{{{ {} }}}}'", where));
          n = n * 10 + (c - '0');
        }
        if (inside.empty()) unsupported(site, fmt::format("'{{{{ {} }}}}'", where));
        index = n;
      }
    } else {
      unsupported(site, fmt::format("'{{{{ {} }}}}'", where));
    }
    first = false;
    if (index) {
      TITAN_CHECK_VALUE(value->is_array() && *index < static_cast<int64_t>(value->size()),
                        "[titan::eval] {}: {}: expected '{}' to index a list of more than {} items, got {}. Fix the "
                        "template or the data file.",
                        site.file, site.key, where, *index, value->dump());
      value = &(*value)[static_cast<size_t>(*index)];
    } else {
      TITAN_CHECK_VALUE(value->is_object() && value->contains(key),
                        "[titan::eval] {}: {}: expected the document to have '{}' (in '{}'), got {}. Name a field of "
                        "the data file.",
                        site.file, site.key, key, where,
                        value->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      value = &(*value)[key];
    }
  }
  return *value;
}

// Jinja's print form of a scalar (Python's str()).
std::string printed(const nlohmann::ordered_json& value, const TemplateSite& site, std::string_view path) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_boolean()) return value.get<bool>() ? "True" : "False";
  if (value.is_null()) return "None";
  if (value.is_number_integer()) return std::to_string(value.get<int64_t>());
  if (value.is_number_float()) {
    const double d = value.get<double>();
    // Python prints the shortest round-trip form and keeps ".0" on whole numbers.
    return std::floor(d) == d && std::abs(d) < 1e16 ? fmt::format("{:.1f}", d) : fmt::format("{}", d);
  }
  TITAN_CHECK_VALUE(false,
                    "[titan::eval] {}: {}: expected '{{{{ {} }}}}' to name text or a number, got {}. A list is a value "
                    "only as the whole of doc_to_choice (\"{{{{choices}}}}\").",
                    site.file, site.key, path, value.dump());
  return {};
}

}  // namespace

std::string render_template(std::string_view text, const nlohmann::ordered_json& doc, const TemplateSite& site) {
  if (text.find("{%") != std::string_view::npos || text.find("{#") != std::string_view::npos)
    unsupported(site, "a statement or comment ({% ... %}, {# ... #})");
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t open = text.find("{{", i);
    out += text.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i);
    if (open == std::string_view::npos) break;
    const size_t close = text.find("}}", open + 2);
    if (close == std::string_view::npos) unsupported(site, "an unclosed '{{'");
    const std::string_view path = trim_expression(text.substr(open + 2, close - open - 2));
    out += printed(lookup(path, doc, site), site, path);
    i = close + 2;
  }
  return out;
}

std::optional<nlohmann::ordered_json> single_field(std::string_view text, const nlohmann::ordered_json& doc,
                                                   const TemplateSite& site) {
  const std::string_view t = trim_expression(text);
  if (!t.starts_with("{{") || !t.ends_with("}}") || t.find("{{", 2) != std::string_view::npos) return std::nullopt;
  return lookup(trim_expression(t.substr(2, t.size() - 4)), doc, site);
}

}  // namespace titan::eval::detail
