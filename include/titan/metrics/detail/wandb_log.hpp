// SPDX-License-Identifier: BSD-3-Clause
// The framing of W&B's transaction log (run-<id>.wandb), LevelDB's log format with W&B's header and CRC:
//   file   := ":W&B" magic:uint16 (0xBEE1) version:uint8 (0), then 32 KiB blocks (the first begins after it)
//   block  := fragment* trailer?       (a trailer: zeros where fewer than 7 bytes are left in a block)
//   fragment := crc:uint32 length:uint16 type:uint8 data[length]   (little-endian; type 1 FULL, 2 FIRST,
//               3 MIDDLE, 4 LAST: a record that does not fit the block's rest is split across blocks)
//   crc    := IEEE CRC-32 (zlib's) of the type byte then the data, unmasked
// Each record is one encoded wandb_internal.Record. Exposed so that tests can place records on the block
// boundaries; metrics/wandb.hpp is the writer to use.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string_view>

namespace titan::detail {

inline constexpr int64_t kWandbLogBlock = 32768;
inline constexpr int64_t kWandbLogHeader = 7;  ///< bytes of a fragment's header, and of the file's

class WandbLog {
 public:
  /// Creates `path` (truncating it) with the file header. Throws naming the path when it cannot.
  explicit WandbLog(const std::filesystem::path& path);
  ~WandbLog();
  WandbLog(const WandbLog&) = delete;
  WandbLog& operator=(const WandbLog&) = delete;

  /// Frames `record` into fragments, appends them and flushes the file. Throws naming the path on a write
  /// error.
  void append(std::string_view record);
  /// Bytes written so far.
  int64_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace titan::detail
