// SPDX-License-Identifier: BSD-3-Clause
// The part of Jinja that lm-eval task files use to read a document's fields: `{{ path }}` where a path is a field
// name followed by `.name`, `[0]` or `['name']` steps. Filters, calls, statements and anything else are errors
// that name the key and say to precompute the field in the data file.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace titan::eval::detail {

/// Where a template comes from, for errors: "tasks/foo.yaml: doc_to_text".
struct TemplateSite {
  std::string file{};
  std::string key{};
};

/// `text` with every `{{ path }}` replaced by the value it names in `doc`, as Jinja prints it (strings as they
/// are, integers in decimal, booleans True/False, null None). A missing field is an error (lm-eval renders with
/// StrictUndefined), as is a value Jinja would print as a Python list or dict.
std::string render_template(std::string_view text, const nlohmann::ordered_json& doc, const TemplateSite& site);

/// The value a template of exactly one `{{ path }}` names in `doc` (a list stays a list: lm-eval's
/// doc_to_choice: "{{choices}}"), or nullopt when the template is more than that.
std::optional<nlohmann::ordered_json> single_field(std::string_view text, const nlohmann::ordered_json& doc,
                                                   const TemplateSite& site);

}  // namespace titan::eval::detail
