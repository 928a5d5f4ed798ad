// SPDX-License-Identifier: BSD-3-Clause
#include "titan/checkpoint/safetensors.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>
#include <algorithm>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "titan/core/error.hpp"

namespace titan::checkpoint {
namespace fs = std::filesystem;

namespace {

const std::pair<const char*, at::ScalarType> kDtypes[] = {
    {"F32", at::kFloat},
    {"BF16", at::kBFloat16},
    {"F16", at::kHalf},
    {"F64", at::kDouble},
    {"I64", at::kLong},
    {"I32", at::kInt},
    {"U8", at::kByte},
    {"BOOL", at::kBool},
    {"I16", at::kShort},
    {"I8", at::kChar},
    {"F8_E4M3", at::kFloat8_e4m3fn},
    {"F8_E5M2", at::kFloat8_e5m2},
};

// Writes all of [data, data + size) to fd, retrying short writes.
void write_all(int fd, const void* data, int64_t size, const fs::path& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, static_cast<size_t>(std::min<int64_t>(size, int64_t{1} << 30)));
    TITAN_CHECK(n > 0 || errno == EINTR,
                "[titan::checkpoint] expected to write '{}', got error '{}'. Check free space "
                "and permissions.",
                path.string(), std::strerror(errno));
    if (n > 0) {
      p += n;
      size -= n;
    }
  }
}

// As strict as the reference reader: every tensor's bytes are its shape x dtype, and the tensors tile the data
// section exactly (a header length off by one would otherwise shift every tensor).
void check_coverage(const std::filesystem::path& path, const std::map<std::string, TensorEntry>& entries,
                    int64_t data_start, int64_t file_size) {
  std::vector<std::pair<int64_t, int64_t>> ranges;  // (begin, end) in file bytes
  for (const auto& [name, e] : entries) {
    const std::optional<int64_t> bytes = detail::checked_nbytes(e.shape, scalar_type(e.dtype));
    TITAN_CHECK_VALUE(bytes.has_value(),
                      "[titan::checkpoint] expected tensor '{}' in '{}' to have non-negative dims whose byte size "
                      "fits in 63 bits, got {} {}. The file is corrupt; restore it or load an older checkpoint.",
                      name, path.string(), e.dtype, c10::str(e.shape));
    TITAN_CHECK_VALUE(e.begin >= data_start && e.end - e.begin == *bytes,
                      "[titan::checkpoint] expected tensor '{}' in '{}' to span {} bytes ({} {}) inside the data "
                      "section, got bytes [{}, {}). The file is corrupt; restore it or load an older checkpoint.",
                      name, path.string(), *bytes, e.dtype, c10::str(e.shape), e.begin - data_start,
                      e.end - data_start);
    ranges.emplace_back(e.begin, e.end);
  }
  std::sort(ranges.begin(), ranges.end());
  int64_t covered = data_start;
  for (const auto& [begin, end] : ranges) {
    TITAN_CHECK_VALUE(begin == covered,
                      "[titan::checkpoint] expected the tensors of '{}' to follow each other from the end of its "
                      "header, got a {} at data byte {}. The file is corrupt (a wrong header length?) or not "
                      "safetensors; restore it or load an older checkpoint.",
                      path.string(), begin < covered ? "overlap" : "gap", covered - data_start);
    covered = end;
  }
  TITAN_CHECK_VALUE(covered == file_size,
                    "[titan::checkpoint] expected the tensors of '{}' to cover its data section to the end, got "
                    "{} of {} bytes covered (incomplete metadata). The file is corrupt; restore it or load an "
                    "older checkpoint.",
                    path.string(), covered - data_start, file_size - data_start);
}

}  // namespace

namespace detail {

std::optional<int64_t> checked_nbytes(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype));
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes)) return std::nullopt;
  }
  return bytes;
}

}  // namespace detail

bool is_safetensors_dtype(const std::string& name) {
  return std::any_of(std::begin(kDtypes), std::end(kDtypes), [&](const auto& d) { return name == d.first; });
}

std::string safetensors_dtype(at::ScalarType t) {
  for (const auto& [name, type] : kDtypes) {
    if (type == t) return name;
  }
  TITAN_CHECK_VALUE(false,
                    "[titan::checkpoint] expected a dtype safetensors can store (float32, bfloat16, float16, "
                    "float64, int64, int32, int16, int8, uint8, bool, float8_e4m3fn, float8_e5m2), got {}.",
                    c10::toString(t));
  return {};
}

at::ScalarType scalar_type(const std::string& safetensors_dtype) {
  for (const auto& [name, type] : kDtypes) {
    if (name == safetensors_dtype) return type;
  }
  TITAN_CHECK_VALUE(false,
                    "[titan::checkpoint] expected a safetensors dtype titan reads (F32, BF16, F16, F64, I64, I32, "
                    "I16, I8, U8, BOOL, F8_E4M3, F8_E5M2), got '{}'.",
                    safetensors_dtype);
  return at::kFloat;
}

std::vector<uint32_t> chunk_checksums(const void* data, int64_t size) {
  std::vector<uint32_t> out;
  const auto* p = static_cast<const Bytef*>(data);
  for (int64_t at = 0; at < size || (size == 0 && out.empty()); at += kChecksumChunkBytes) {
    const int64_t n = std::min(kChecksumChunkBytes, size - at);
    out.push_back(static_cast<uint32_t>(crc32(0L, p + at, static_cast<uInt>(n))));
  }
  return out;
}

SafetensorsFile::SafetensorsFile(fs::path path) : path_(std::move(path)) {
  std::error_code ec;
  TITAN_CHECK_VALUE(fs::is_regular_file(path_, ec), "[titan::checkpoint] expected a safetensors file at '{}', got {}.",
                    path_.string(), fs::exists(path_, ec) ? "something else (a folder?)" : "none");
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  TITAN_CHECK_VALUE(fd_ >= 0, "[titan::checkpoint] expected a readable safetensors file, got none at '{}' ({}).",
                    path_.string(), std::strerror(errno));
  const auto file_size = static_cast<int64_t>(fs::file_size(path_));
  uint64_t header_size = 0;
  TITAN_CHECK_VALUE(file_size >= 8,
                    "[titan::checkpoint] expected a safetensors header in '{}', got a file of {} bytes "
                    "(truncated or not safetensors).",
                    path_.string(), file_size);
  read_bytes(0, 8, &header_size);
  // The reference reader's limits, checked before the header is allocated.
  TITAN_CHECK_VALUE(header_size <= kMaxHeaderBytes,
                    "[titan::checkpoint] expected a safetensors header of at most {} bytes in '{}', got a length of "
                    "{} (corrupt or not safetensors).",
                    kMaxHeaderBytes, path_.string(), header_size);
  TITAN_CHECK_VALUE(static_cast<int64_t>(header_size) + 8 <= file_size,
                    "[titan::checkpoint] expected a safetensors header of {} bytes in '{}', got a file of {} bytes "
                    "(truncated or not safetensors).",
                    header_size, path_.string(), file_size);
  std::string text(header_size, '\0');
  read_bytes(8, static_cast<int64_t>(header_size), text.data());
  // NOTE: nlohmann's parser rejects invalid UTF-8 and trailing bytes other than JSON whitespace, as serde_json does.
  const auto header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TITAN_CHECK_VALUE(header.is_object(),
                    "[titan::checkpoint] expected a JSON object as the header of '{}', got {} "
                    "(corrupt or not safetensors).",
                    path_.string(), header.is_discarded() ? "unparsable bytes or invalid UTF-8" : header.type_name());
  const int64_t data_start = 8 + static_cast<int64_t>(header_size);
  const auto corrupt = [&](const std::string& name, const std::string& expected, const nlohmann::json& got) {
    std::string shown = got.dump(-1, ' ', /*ensure_ascii=*/true);
    if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
    TITAN_CHECK_VALUE(false,
                      "[titan::checkpoint] expected {} for entry '{}' of '{}', got {}. The file is corrupt or not "
                      "safetensors; restore it or load an older checkpoint.",
                      expected, name, path_.string(), shown);
  };
  // A non-negative JSON integer (serde's usize: -0 is 0, 8.0 is refused), as int64.
  const auto index = [&](const std::string& name, const std::string& what, const nlohmann::json& v) {
    const bool ok = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                                           : v.is_number_integer() && v.get<int64_t>() == 0;
    if (!ok) corrupt(name, fmt::format("a non-negative integer as {}", what), v);
    return v.get<int64_t>();
  };
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (value.is_null()) continue;  // serde's Option: null is no metadata
      if (!value.is_object()) corrupt(name, "an object of strings", value);
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) corrupt(name + "." + k, "a string", v);
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!value.is_object()) corrupt(name, "an object {dtype, shape, data_offsets}", value);
    const auto dtype = value.find("dtype"), shape = value.find("shape"), offsets = value.find("data_offsets");
    if (dtype == value.end() || !dtype->is_string()) corrupt(name, "a string dtype", value);
    if (!is_safetensors_dtype(dtype->get<std::string>())) {
      corrupt(name, "a dtype titan reads (F32, BF16, F16, F64, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2)", *dtype);
    }
    if (shape == value.end() || !shape->is_array()) corrupt(name, "an array as shape", value);
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2) {
      corrupt(name, "two data_offsets [begin, end]", value);
    }
    TensorEntry e{.dtype = dtype->get<std::string>(), .shape = {}, .begin = 0, .end = 0};
    for (const auto& d : *shape) e.shape.push_back(index(name, "a dim", d));
    const int64_t begin = index(name, "data_offsets[0]", (*offsets)[0]);
    const int64_t end = index(name, "data_offsets[1]", (*offsets)[1]);
    // Offsets inside the data section (no overflow past it: begin, end <= file size < 2^63).
    TITAN_CHECK_VALUE(begin <= end && end <= file_size - data_start,
                      "[titan::checkpoint] expected entry '{}' of '{}' to lie in the data section of {} bytes, got "
                      "data_offsets [{}, {}) (truncated or corrupt). Restore the file or load an older checkpoint.",
                      name, path_.string(), file_size - data_start, begin, end);
    e.begin = data_start + begin;
    e.end = data_start + end;
    entries_.emplace(name, std::move(e));
  }
  check_coverage(path_, entries_, data_start, file_size);
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}
SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      metadata_(std::move(o.metadata_)),
      entries_(std::move(o.entries_)) {}
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  std::swap(path_, o.path_);
  std::swap(fd_, o.fd_);
  std::swap(metadata_, o.metadata_);
  std::swap(entries_, o.entries_);
  return *this;
}

const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  TITAN_CHECK_VALUE(it != entries_.end(),
                    "[titan::checkpoint] expected tensor '{}' in '{}', got none. The file is of "
                    "another model or flavor.",
                    name, path_.string());
  return it->second;
}

void SafetensorsFile::read_bytes(int64_t offset, int64_t size, void* dst) const {
  char* p = static_cast<char*>(dst);
  while (size > 0) {
    const ssize_t n = ::pread(fd_, p, static_cast<size_t>(std::min<int64_t>(size, int64_t{1} << 30)), offset);
    TITAN_CHECK_VALUE(n > 0 || (n < 0 && errno == EINTR),
                      "[titan::checkpoint] expected {} more bytes at offset {} of "
                      "'{}', got {} (truncated file or read error).",
                      size, offset, path_.string(),
                      n == 0 ? std::string("end of file") : std::string(std::strerror(errno)));
    if (n > 0) {
      p += n;
      offset += n;
      size -= n;
    }
  }
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const TensorEntry& e = entry(name);
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(scalar_type(e.dtype)));
  TITAN_CHECK_VALUE(static_cast<int64_t>(t.nbytes()) == e.end - e.begin,
                    "[titan::checkpoint] expected tensor '{}' in "
                    "'{}' to hold {} bytes ({} {}), got {}.",
                    name, path_.string(), t.nbytes(), e.dtype, c10::str(at::IntArrayRef(e.shape)), e.end - e.begin);
  read_bytes(e.begin, e.end - e.begin, t.data_ptr());
  return t;
}

std::vector<WrittenTensor> write_safetensors(const fs::path& path,
                                             const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                             const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<WrittenTensor> out;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    TITAN_CHECK(t.device().is_cpu() && t.is_contiguous(),
                "[titan::checkpoint] expected '{}' as a contiguous CPU tensor, "
                "got {} on {}.",
                name, t.is_contiguous() ? "contiguous" : "strided", t.device().str());
    const auto bytes = static_cast<int64_t>(t.nbytes());
    header[name] = {{"dtype", safetensors_dtype(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    out.push_back({.entry = {.dtype = safetensors_dtype(t.scalar_type()),
                             .shape = t.sizes().vec(),
                             .begin = offset,
                             .end = offset + bytes},
                   .crc32 = chunk_checksums(t.data_ptr(), bytes)});
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';  // keeps the data 8-byte aligned
  const auto data_start = static_cast<int64_t>(8 + text.size());
  for (auto& w : out) {
    w.entry.begin += data_start;
    w.entry.end += data_start;
  }
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  const fs::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TITAN_CHECK(fd >= 0, "[titan::checkpoint] expected to create '{}', got error '{}'. Check the folder's permissions.",
              tmp.string(), std::strerror(errno));
  try {
    const uint64_t size = text.size();
    write_all(fd, &size, 8, tmp);
    write_all(fd, text.data(), static_cast<int64_t>(text.size()), tmp);
    for (const auto& [name, t] : tensors) write_all(fd, t.data_ptr(), static_cast<int64_t>(t.nbytes()), tmp);
    TITAN_CHECK(::fsync(fd) == 0, "[titan::checkpoint] expected to flush '{}' to disk, got error '{}'.", tmp.string(),
                std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  fs::rename(tmp, path);
  return out;
}

void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    TITAN_CHECK(out.good(),
                "[titan::checkpoint] expected to write '{}', got a write error. Check free space and "
                "permissions.",
                tmp.string());
  }
  fs::rename(tmp, path);
}

at::Tensor read_region(const SafetensorsFile& file, const TensorEntry& entry, const std::vector<int64_t>& stored_offset,
                       const std::vector<int64_t>& offset, const std::vector<int64_t>& shape,
                       const std::vector<uint32_t>* crc32, const std::string& what) {
  const at::ScalarType dtype = scalar_type(entry.dtype);
  const auto ndim = entry.shape.size();
  TITAN_CHECK(offset.size() == ndim && shape.size() == ndim && stored_offset.size() == ndim,
              "[titan::checkpoint] expected a {}-d region of '{}' in '{}', got offset {} shape {}.", ndim, what,
              file.path().string(), c10::str(at::IntArrayRef(offset)), c10::str(at::IntArrayRef(shape)));
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  std::vector<int64_t> strides(ndim, 1);
  for (size_t d = ndim; d-- > 1;) strides[d - 1] = strides[d] * entry.shape[d];
  int64_t numel = 1, first = 0, last = 0;
  for (size_t d = 0; d < ndim; ++d) {
    const int64_t lo = offset[d] - stored_offset[d];
    TITAN_CHECK(lo >= 0 && lo + shape[d] <= entry.shape[d],
                "[titan::checkpoint] expected the region to lie inside the "
                "stored shard of '{}' in '{}', got dim {} [{}, {}) outside [0, {}).",
                what, file.path().string(), d, lo, lo + shape[d], entry.shape[d]);
    numel *= shape[d];
    first += lo * strides[d];
    last += (lo + shape[d] - 1) * strides[d];
  }
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
  if (numel == 0) return out;
  const int64_t total = entry.end - entry.begin;
  int64_t begin = first * elem, end = (last + 1) * elem;  // bytes within the tensor
  if (crc32 != nullptr) {
    begin = begin / kChecksumChunkBytes * kChecksumChunkBytes;
    end = std::min(total, (end + kChecksumChunkBytes - 1) / kChecksumChunkBytes * kChecksumChunkBytes);
  }
  at::Tensor span = at::empty({end - begin}, at::TensorOptions().dtype(at::kByte));  // the bytes read
  file.read_bytes(entry.begin + begin, end - begin, span.data_ptr());
  if (crc32 != nullptr) {
    const auto* p = span.data_ptr<uint8_t>();
    for (int64_t at = begin; at < end; at += kChecksumChunkBytes) {
      const int64_t n = std::min(kChecksumChunkBytes, end - at);
      const auto chunk = static_cast<size_t>(at / kChecksumChunkBytes);
      const auto got = static_cast<uint32_t>(::crc32(0L, p + (at - begin), static_cast<uInt>(n)));
      TITAN_CHECK_VALUE(
          chunk < crc32->size() && got == (*crc32)[chunk],
          "[titan::checkpoint] expected checksum {:08x} for bytes [{}, {}) of tensor '{}' in '{}', got "
          "{:08x}: the file is corrupt. Load an older checkpoint (checkpoint.load_step) or restore the file.",
          chunk < crc32->size() ? (*crc32)[chunk] : 0u, at, at + n, what, file.path().string(), got);
    }
  }
  const at::Tensor typed = span.view(dtype);  // (span elements)
  out.copy_(typed.as_strided(shape, strides, first - begin / elem));
  return out;
}

}  // namespace titan::checkpoint
