// SPDX-License-Identifier: BSD-3-Clause
// Private to src/data: a forward-only line reader over plain, gzip (.gz) and zstd (.zst) files that
// counts uncompressed bytes and lines, so a stream position is (file, byte offset, line) and can be
// restored by reading forward to the offset (compressed files cannot seek; plain files do).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

namespace titan::data::detail {

/// Uncompressed bytes of one file, read in chunks.
class ByteStream {
 public:
  virtual ~ByteStream() = default;
  /// Up to `n` bytes into `out`; 0 at the end. Throws naming the file on a read or decode error.
  virtual size_t read(char* out, size_t n) = 0;
  /// Moves to uncompressed byte `offset` (forward reads for compressed files).
  virtual void seek(int64_t offset) = 0;
};

/// Opens `path` by its extension: `.gz` (zlib), `.zst` (libzstd), anything else as plain bytes.
/// Throws c10::ValueError naming the file when it cannot be opened.
std::unique_ptr<ByteStream> open_byte_stream(const std::filesystem::path& path);

class LineReader {
 public:
  explicit LineReader(const std::filesystem::path& path);

  /// The next line without its '\n' (and without a trailing '\r'); false at the end of the file.
  /// The view is valid until the next call.
  bool next(std::string_view& line);
  /// Continues at uncompressed byte `offset`, which is the start of line `line` (1-based).
  void seek(int64_t offset, int64_t line);

  /// Uncompressed bytes consumed so far: the offset of the line next() returns next.
  int64_t offset() const { return offset_; }
  /// 1-based number of the line next() returns next.
  int64_t line() const { return line_; }

 private:
  bool refill();

  std::unique_ptr<ByteStream> stream_;
  std::string buffer_;
  size_t head_ = 0;  // unread bytes are buffer_[head_, end)
  bool eof_ = false;
  int64_t offset_ = 0;
  int64_t line_ = 1;
  std::string long_line_;  // a line that crossed a refill
};

/// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
/// On false, `bad_at` is the byte offset of the first invalid sequence.
bool is_valid_utf8(std::string_view s, size_t* bad_at = nullptr);

}  // namespace titan::data::detail
