// SPDX-License-Identifier: BSD-3-Clause
// The part of YAML that lm-eval-harness task files use: block mappings and sequences by indentation, plain,
// single- and double-quoted scalars, flow sequences of scalars, comments. Anything else (block scalars, flow
// mappings, anchors, tags such as !function, multi-line scalars) is an error naming the file and line, never a
// silent misreading. The tree comes back as JSON (task.cpp reads it).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace titan::eval::detail {

/// The document of `text` (the contents of `file`, named in errors) as JSON: mappings as objects (keys in file
/// order), sequences as arrays; plain scalars typed as YAML 1.2's core schema types them (null, true/false,
/// integers, floats, else strings), quoted scalars always strings.
nlohmann::ordered_json parse_yaml_subset(std::string_view text, const std::string& file);

}  // namespace titan::eval::detail
