// SPDX-License-Identifier: BSD-3-Clause
// Private to src/data: reading JSON/text files with errors that name the file, and atomic writes.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <string_view>

namespace titan::data::detail {

/// The bytes of `path`; `where` (e.g. "titan::data::BpeTokenizer") prefixes the error.
std::string read_text_file(const std::filesystem::path& path, std::string_view where);

/// `path` parsed as JSON; a syntax error names the byte where parsing stopped.
nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view where);

/// Writes `content` to a temporary file beside `path` and renames it over `path`, so readers see
/// the old file or the new one, never half of one.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

}  // namespace titan::data::detail
