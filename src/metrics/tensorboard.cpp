// SPDX-License-Identifier: BSD-3-Clause
// TensorBoardWriter (see metrics/tensorboard.hpp). The messages and fields written (wire format in
// metrics/detail/protobuf_wire.hpp):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
#include "titan/metrics/tensorboard.hpp"

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "host_name.hpp"
#include "titan/core/error.hpp"
#include "titan/metrics/detail/crc32c.hpp"
#include "titan/metrics/detail/protobuf_wire.hpp"

namespace titan {
namespace {

using namespace detail::pb;

// Event fields 1 and 2, which every event carries.
std::string event_header(double wall_time, int64_t step) {
  std::string event;
  put_key(event, 1, kFixed64);
  put_raw(event, wall_time);
  put_int(event, 2, step);
  return event;
}

std::string scalar_event(double wall_time, int64_t step, std::span<const Scalar> scalars) {
  std::string summary;
  for (const Scalar& s : scalars) {
    std::string value;
    put_bytes(value, 1, s.tag);
    put_key(value, 2, kFixed32);
    put_raw(value, static_cast<float>(s.value));
    put_bytes(summary, 1, value);
  }
  std::string event = event_header(wall_time, step);
  put_bytes(event, 5, summary);
  return event;
}

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::filesystem::path tensorboard_folder(const std::filesystem::path& dump_folder, const std::string& save_tb_folder,
                                         std::time_t start, std::optional<int64_t> rank) {
  std::tm local{};
  localtime_r(&start, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M", &local);
  std::filesystem::path folder = dump_folder / save_tb_folder / stamp;
  if (rank) folder /= fmt::format("rank_{}", *rank);
  return folder;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& folder) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  const double now = wall_time_now();
  path_ =
      folder / fmt::format("events.out.tfevents.{}.{}.{}", static_cast<int64_t>(now), detail::host_name(), getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  TITAN_CHECK(file_ != nullptr,
              "[titan::TensorBoardWriter] expected a writable event file, got '{}' opening '{}'. Check "
              "job.dump_folder and metrics.save_tb_folder.",
              std::strerror(errno), path_.string());
  std::string event = event_header(now, 0);
  put_bytes(event, 3, "brain.Event:2");
  write_record(event);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step, std::span<const Scalar> scalars) {
  write_record(scalar_event(wall_time_now(), step, scalars));
}

void TensorBoardWriter::write(int64_t step, const nlohmann::json& record) {
  std::vector<Scalar> scalars;
  for (const auto& [key, value] : record.items()) {
    if (key != "step" && value.is_number()) scalars.push_back({.tag = key, .value = value.get<double>()});
  }
  add_scalars(step, scalars);
}

void TensorBoardWriter::write_record(const std::string& data) {
  // TFRecord: uint64 length, masked CRC-32C of those 8 bytes, the data, masked CRC-32C of the data.
  std::string record;
  record.reserve(data.size() + 16);
  put_raw(record, static_cast<uint64_t>(data.size()));
  put_raw(record, detail::mask_crc32c(detail::crc32c(record)));
  record.append(data);
  put_raw(record, detail::mask_crc32c(detail::crc32c(data)));
  const bool written = std::fwrite(record.data(), 1, record.size(), file_) == record.size();
  TITAN_CHECK(written && std::fflush(file_) == 0,
              "[titan::TensorBoardWriter] expected to append {} bytes to '{}', got '{}'. Is the disk full?",
              record.size(), path_.string(), std::strerror(errno));
}

}  // namespace titan
