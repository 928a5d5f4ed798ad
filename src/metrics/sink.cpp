// SPDX-License-Identifier: BSD-3-Clause
#include "titan/metrics/sink.hpp"

#include <nlohmann/json.hpp>

#include "titan/core/error.hpp"

namespace titan {

JsonlWriter::JsonlWriter(const std::filesystem::path& path) : path_(path), out_(path, std::ios::app) {
  TITAN_CHECK(out_.good(),
              "[titan::MetricsProcessor] expected a writable metrics file, got an error opening '{}'. Check "
              "job.dump_folder.",
              path_.string());
}

void JsonlWriter::write(int64_t /*step*/, const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  TITAN_CHECK(out_.good(),
              "[titan::JsonlWriter] expected to append a line to '{}', got a write error. Is the disk full?",
              path_.string());
}

}  // namespace titan
