// SPDX-License-Identifier: BSD-3-Clause
// File helpers for src/data (see json_file.hpp).
#include "json_file.hpp"

#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "titan/core/error.hpp"

namespace titan::data::detail {

std::string read_text_file(const std::filesystem::path& path, std::string_view where) {
  std::ifstream in(path, std::ios::binary);
  TITAN_CHECK_VALUE(in.good(), "[{}] expected a readable file at {}, got {}.", where, path.string(),
                    std::filesystem::exists(path) ? "one that cannot be opened" : "no such file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view where) {
  const std::string text = read_text_file(path, where);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    TITAN_CHECK_VALUE(false,
                      "[{}] {}: expected valid JSON, got a syntax error at byte {} of {}: {}. The file is "
                      "truncated or not JSON; re-create or re-download it.",
                      where, path.string(), e.byte, text.size(), e.what());
  }
  return {};
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  std::random_device rd;
  const std::filesystem::path tmp = path.string() + fmt::format(".tmp.{}.{:08x}", static_cast<long>(::getpid()), rd());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TITAN_CHECK_VALUE(out.good(),
                      "[titan::data] expected to create {}, got an error. Check that the folder "
                      "exists and is writable.",
                      tmp.string());
    out.write(content.data(), std::streamsize(content.size()));
    out.flush();
    TITAN_CHECK_VALUE(out.good(), "[titan::data] expected to write {} bytes to {}, got a write error (disk full?).",
                      content.size(), tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp);
  TITAN_CHECK_VALUE(!ec, "[titan::data] expected to rename {} to {}, got: {}.", tmp.string(), path.string(),
                    ec.message());
}

}  // namespace titan::data::detail
