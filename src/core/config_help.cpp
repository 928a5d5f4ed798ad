// SPDX-License-Identifier: BSD-3-Clause
// --help text: every key with its type, default and the one-line `///` doc from config.hpp, which the
// build extracts into config_docs.inc (cmake/TitanConfigDocs.cmake) so the header stays the only source.
#include "config_detail.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <type_traits>

namespace titan {
namespace {

struct FieldDoc {
  std::string_view owner;  // struct name
  std::string_view field;  // "" = the struct itself
  std::string_view doc;
};

constexpr FieldDoc kFieldDocs[] = {
#include "titan/core/detail/config_docs.inc"
};

std::string_view doc_of(std::string_view owner, std::string_view field) {
  for (const FieldDoc& d : kFieldDocs) {
    if (d.owner == owner && d.field == field) return d.doc;
  }
  return "(undocumented)";
}

template <class T>
std::string_view owner_name(const T&) {
  return reflected_name(static_cast<const T*>(nullptr));
}

}  // namespace

std::string config_help() {
  using namespace config_detail;
  std::string out = fmt::format(
      "Usage: [--config PRESET] [--job.config_file FILE] [--section.key VALUE]...\n"
      "Layers, later wins: defaults < --config PRESET < --job.config_file (TOML, or JSON by extension)\n"
      "< --section.key VALUE or --section.key=VALUE. Booleans: --section.flag, --section.no_flag or\n"
      "--section.flag true|false. Lists: a,b,c. Unset an optional with None. See docs/config.md.\n"
      "Presets: {}\n",
      fmt::join(preset_names(), ", "));
  const JobConfig defaults;
  for_each_field(defaults, [&](std::string_view section, const auto& fields) {
    fmt::format_to(std::back_inserter(out), "\n[{}]  {}\n", section, doc_of(owner_name(fields), ""));
    detail::for_each_leaf(fields, std::string(section),
                          [&](std::string_view key, std::string_view owner, std::string_view field, const auto& value) {
                            using T = std::remove_cvref_t<decltype(value)>;
                            const json shown = to_json_value(value);
                            fmt::format_to(std::back_inserter(out), "  --{} {} (default: {})  {}\n", key,
                                           type_name(Tag<T>{}), shown.is_null() ? "None" : shown.dump(),
                                           doc_of(owner, field));
                          });
  });
  fmt::format_to(std::back_inserter(out),
                 "\nRecognised torchtitan sections titan does not support (any key loads, with a note): [{}]\n",
                 fmt::join(recognised_unsupported_sections(), "], ["));
  return out;
}

}  // namespace titan
