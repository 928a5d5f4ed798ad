// SPDX-License-Identifier: BSD-3-Clause
// LineReader over plain / gzip / zstd byte streams (see line_reader.hpp).
#include "line_reader.hpp"

#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "titan/core/error.hpp"
#include "unicode.hpp"

namespace titan::data::detail {
namespace {

namespace fs = std::filesystem;

constexpr size_t kChunk = size_t(1) << 20;

// Forward seek by reading and dropping bytes: what compressed formats allow.
void skip_by_reading(ByteStream& s, int64_t bytes, const fs::path& path) {
  std::vector<char> sink(kChunk);
  while (bytes > 0) {
    const size_t n = s.read(sink.data(), size_t(std::min<int64_t>(bytes, int64_t(kChunk))));
    TITAN_CHECK_VALUE(n > 0,
                      "[titan::data::LineReader] {}: expected {} more bytes to reach the saved offset, got the "
                      "end of the file. The file changed since the state was saved.",
                      path.string(), bytes);
    bytes -= int64_t(n);
  }
}

class PlainStream final : public ByteStream {
 public:
  explicit PlainStream(const fs::path& path) : path_(path), file_(std::fopen(path.c_str(), "rb")) {
    TITAN_CHECK_VALUE(file_ != nullptr, "[titan::data::LineReader] expected a readable file at {}, got \"{}\".",
                      path.string(), std::strerror(errno));
  }
  ~PlainStream() override { std::fclose(file_); }
  size_t read(char* out, size_t n) override {
    const size_t got = std::fread(out, 1, n, file_);
    TITAN_CHECK_VALUE(got > 0 || !std::ferror(file_), "[titan::data::LineReader] {}: expected to read it, got \"{}\".",
                      path_.string(), std::strerror(errno));
    return got;
  }
  void seek(int64_t offset) override {
    TITAN_CHECK_VALUE(std::fseek(file_, long(offset), SEEK_SET) == 0,
                      "[titan::data::LineReader] {}: expected to "
                      "seek to byte {}, got \"{}\".",
                      path_.string(), offset, std::strerror(errno));
  }

 private:
  fs::path path_;
  std::FILE* file_;
};

class GzipStream final : public ByteStream {
 public:
  explicit GzipStream(const fs::path& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    TITAN_CHECK_VALUE(file_ != nullptr, "[titan::data::LineReader] expected a readable gzip file at {}, got \"{}\".",
                      path.string(), std::strerror(errno));
    gzbuffer(file_, unsigned(kChunk));
  }
  ~GzipStream() override { gzclose(file_); }
  size_t read(char* out, size_t n) override {
    const int got = gzread(file_, out, unsigned(n));
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(file_, &code);
      TITAN_CHECK_VALUE(false, "[titan::data::LineReader] {}: expected valid gzip data, got \"{}\" after {} bytes.",
                        path_.string(), message, gztell(file_));
    }
    return size_t(got);
  }
  void seek(int64_t offset) override { skip_by_reading(*this, offset, path_); }

 private:
  fs::path path_;
  gzFile file_;
};

class ZstdStream final : public ByteStream {
 public:
  explicit ZstdStream(const fs::path& path) : path_(path), raw_(path), ctx_(ZSTD_createDCtx()), in_(kChunk) {}
  ~ZstdStream() override { ZSTD_freeDCtx(ctx_); }
  ZstdStream(const ZstdStream&) = delete;
  ZstdStream& operator=(const ZstdStream&) = delete;

  size_t read(char* out, size_t n) override {
    ZSTD_outBuffer output{out, n, 0};
    while (output.pos == 0) {
      if (input_.pos == input_.size) {
        input_ = {in_.data(), raw_.read(in_.data(), in_.size()), 0};
        if (input_.size == 0) {
          TITAN_CHECK_VALUE(last_ == 0,
                            "[titan::data::LineReader] {}: expected a complete zstd frame, got a file "
                            "that ends inside one (truncated?).",
                            path_.string());
          return 0;
        }
      }
      last_ = ZSTD_decompressStream(ctx_, &output, &input_);
      TITAN_CHECK_VALUE(!ZSTD_isError(last_), "[titan::data::LineReader] {}: expected valid zstd data, got \"{}\".",
                        path_.string(), ZSTD_getErrorName(last_));
    }
    return output.pos;
  }
  void seek(int64_t offset) override { skip_by_reading(*this, offset, path_); }

 private:
  fs::path path_;
  PlainStream raw_;
  ZSTD_DCtx* ctx_;
  std::vector<char> in_;
  ZSTD_inBuffer input_{nullptr, 0, 0};
  size_t last_ = 0;  // 0 when the last frame was complete
};

}  // namespace

std::unique_ptr<ByteStream> open_byte_stream(const fs::path& path) {
  const auto ext = path.extension();
  if (ext == ".gz") return std::make_unique<GzipStream>(path);
  if (ext == ".zst") return std::make_unique<ZstdStream>(path);
  return std::make_unique<PlainStream>(path);
}

LineReader::LineReader(const fs::path& path) : stream_(open_byte_stream(path)) {}

bool LineReader::refill() {
  if (eof_) return false;
  buffer_.erase(0, head_);
  head_ = 0;
  const size_t old = buffer_.size();
  buffer_.resize(old + kChunk);
  const size_t got = stream_->read(buffer_.data() + old, kChunk);
  buffer_.resize(old + got);
  eof_ = got == 0;
  return got > 0;
}

bool LineReader::next(std::string_view& line) {
  size_t end;
  while ((end = buffer_.find('\n', head_)) == std::string::npos) {
    if (!refill()) {
      if (head_ == buffer_.size()) return false;
      end = buffer_.size();  // last line without a newline
      break;
    }
  }
  const size_t consumed = std::min(end + 1, buffer_.size()) - head_;
  line = std::string_view(buffer_).substr(head_, end - head_);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  head_ += consumed;
  offset_ += int64_t(consumed);
  ++line_;
  return true;
}

void LineReader::seek(int64_t offset, int64_t line) {
  stream_->seek(offset);
  buffer_.clear();
  head_ = 0;
  eof_ = false;
  offset_ = offset;
  line_ = line;
}

bool is_valid_utf8(std::string_view s, size_t* bad_at) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Char c = decode_utf8(s, i);
    if (c.cp == kInvalidChar) {
      if (bad_at != nullptr) *bad_at = i;
      return false;
    }
    i += c.len;
  }
  return true;
}

}  // namespace titan::data::detail
