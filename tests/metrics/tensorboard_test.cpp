// SPDX-License-Identifier: BSD-3-Clause
// TensorBoard event files: CRC-32C against published vectors, TFRecord's masking, the framing of a
// written file (every record's two CRCs), torchtitan's folder layout. That the tensorboard package reads
// the files, value for value, is tests/train/tensorboard_train_test.cpp.
#include <cstring>
#include <ctime>
#include <vector>

#include "test_util.hpp"
#include "titan/metrics/detail/crc32c.hpp"
#include "titan/metrics/tensorboard.hpp"

using titan::detail::crc32c;
using titan::detail::mask_crc32c;
using titan::detail::unmask_crc32c;

namespace {

// RFC 3720 (iSCSI) appendix B.4 test patterns and the usual check value.
static_assert(crc32c("123456789") == 0xE3069283u);
static_assert(crc32c("") == 0u);

std::string bytes(size_t n, int (*byte)(size_t)) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(byte(i));
  return out;
}

template <class T>
T read_le(const std::string& data, size_t offset) {
  T v;
  std::memcpy(&v, data.data() + offset, sizeof(T));
  return v;
}

}  // namespace

TEST_CASE("CRC-32C: RFC 3720 vectors and TFRecord's masking", "[metrics][tensorboard]") {
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c(bytes(32, [](size_t) { return 0; })) == 0x8A9136AAu);
  CHECK(crc32c(bytes(32, [](size_t) { return 0xFF; })) == 0x62A8AB43u);
  CHECK(crc32c(bytes(32, [](size_t i) { return static_cast<int>(i); })) == 0x46DD794Eu);
  CHECK(crc32c(bytes(32, [](size_t i) { return static_cast<int>(31 - i); })) == 0x113FDB5Cu);
  // Masking: rotate right 15, add 0xa282ead8. Values from the tensorboard package's masked_crc32c.
  CHECK(mask_crc32c(0) == 0xA282EAD8u);
  CHECK(mask_crc32c(crc32c("123456789")) == 0xC78AB0E5u);
  CHECK(mask_crc32c(crc32c(std::string(8, '\0'))) == 0x07980329u);
  for (const uint32_t crc : {0u, 1u, 0xE3069283u, 0xFFFFFFFFu, 0x80000000u})
    CHECK(unmask_crc32c(mask_crc32c(crc)) == crc);
}

TEST_CASE("event file: file_version first then one framed record per step with valid CRCs", "[metrics][tensorboard]") {
  titan::test::TempDir dir;
  std::filesystem::path path;
  {
    titan::TensorBoardWriter writer(dir.path / "tb");
    path = writer.path();
    const std::vector<titan::Scalar> step1 = {{.tag = "loss_metrics/global_avg_loss", .value = 7.5},
                                              {.tag = "lr", .value = 1e-4}};
    writer.add_scalars(1, step1);
    // Written and flushed at once: readable while the writer is open.
    CHECK(std::filesystem::file_size(path) > 0);
    writer.add_scalars(10, std::vector<titan::Scalar>{{.tag = "grad_norm", .value = 0.5}});
  }
  CHECK(path.parent_path() == dir.path / "tb");
  CHECK(path.filename().string().starts_with("events.out.tfevents."));
  const std::string data = titan::test::read_file(path);
  std::vector<std::string> records;
  for (size_t at = 0; at < data.size();) {
    REQUIRE(at + 12 <= data.size());
    const auto length = read_le<uint64_t>(data, at);
    CHECK(unmask_crc32c(read_le<uint32_t>(data, at + 8)) == crc32c(std::string_view(data).substr(at, 8)));
    REQUIRE(at + 12 + length + 4 <= data.size());
    const std::string payload = data.substr(at + 12, length);
    CHECK(unmask_crc32c(read_le<uint32_t>(data, at + 12 + length)) == crc32c(payload));
    records.push_back(payload);
    at += 12 + length + 4;
  }
  REQUIRE(records.size() == 3);
  // Event{wall_time (field 1, fixed64), step (2, varint), file_version (3) "brain.Event:2"}.
  CHECK(records[0][0] == 0x09);
  CHECK(records[0].find("brain.Event:2") != std::string::npos);
  CHECK(std::abs(read_le<double>(records[0], 1) - static_cast<double>(std::time(nullptr))) < 60);
  // Event{..., step 1, summary (5)} holding both tags; step 10 as a one-byte varint.
  CHECK(records[1].substr(9, 2) == std::string("\x10\x01", 2));
  CHECK(records[1][11] == 0x2A);
  CHECK(records[1].find("loss_metrics/global_avg_loss") != std::string::npos);
  CHECK(records[1].find("lr") != std::string::npos);
  CHECK(records[2].substr(9, 2) == std::string("\x10\x0A", 2));
}

// <dump>/<save_tb_folder>/<YYYYmmdd-HHMM>[/rank_<r>]
TEST_CASE("TensorBoard folder: torchtitan's timestamped folder with rank_r below it for all ranks",
          "[metrics][tensorboard]") {
  std::tm t{};
  t.tm_year = 2026 - 1900;
  t.tm_mon = 11;
  t.tm_mday = 1;
  t.tm_hour = 9;
  t.tm_min = 5;
  t.tm_isdst = -1;
  const std::time_t start = std::mktime(&t);  // local time, as the folder name
  CHECK(titan::tensorboard_folder("out", "tb", start) == std::filesystem::path("out/tb/20261201-0905"));
  CHECK(titan::tensorboard_folder("out", "tb", start, 3) == std::filesystem::path("out/tb/20261201-0905/rank_3"));
}
