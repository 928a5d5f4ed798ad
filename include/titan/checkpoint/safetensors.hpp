// SPDX-License-Identifier: BSD-3-Clause
// safetensors files, the one tensor file format titan reads and writes (checkpoint shards, the seed
// checkpoint, Hugging Face weights). Layout: u64 little-endian header size N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}} (offsets relative to the end of the header),
// then the raw bytes. Reads are positioned: a caller reads only the byte ranges it needs, and
// checksums (CRC32 per fixed-size chunk of each tensor) let it verify exactly what it read.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace titan::checkpoint {

/// The longest header the reference reader (Python safetensors) accepts; longer is refused before allocating.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

/// Bytes per checksum chunk: a reader verifies (and so reads) whole chunks around what it needs.
inline constexpr int64_t kChecksumChunkBytes = int64_t{1} << 20;

/// One tensor's place in a safetensors file.
struct TensorEntry {
  std::string dtype;  ///< safetensors dtype: F32, BF16, F16, F64, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2
  std::vector<int64_t> shape{};  ///< as stored
  int64_t begin = 0;             ///< absolute file offset of the first byte
  int64_t end = 0;               ///< absolute file offset one past the last byte
};

/// The safetensors dtype name of t's dtype ("F32"); throws for one safetensors has no name for.
std::string safetensors_dtype(at::ScalarType t);
at::ScalarType scalar_type(const std::string& safetensors_dtype);
/// Whether titan reads this safetensors dtype name.
bool is_safetensors_dtype(const std::string& name);

namespace detail {
/// shape's element count times dtype's size, or nullopt for a negative dim or a product past 2^63.
std::optional<int64_t> checked_nbytes(const std::vector<int64_t>& shape, at::ScalarType dtype);
}  // namespace detail

/// CRC32 of each kChecksumChunkBytes chunk of [data, data + size).
std::vector<uint32_t> chunk_checksums(const void* data, int64_t size);

/// A safetensors file opened for positioned reads. The header is checked on open as strictly as the
/// reference reader does (length at most kMaxHeaderBytes and inside the file, a UTF-8 JSON object, known
/// dtypes, each tensor exactly shape x dtype bytes, the tensors tiling the data section to the end of the
/// file, __metadata__ a string map), so a corrupt or truncated file is refused, naming the file and the
/// entry, before any tensor is allocated or read.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::filesystem::path path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;

  const std::filesystem::path& path() const { return path_; }
  /// The header's __metadata__ (string to string), empty if none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  /// Throws naming the file and the tensor when absent.
  const TensorEntry& entry(const std::string& name) const;
  const std::map<std::string, TensorEntry>& entries() const { return entries_; }
  /// Reads size bytes at absolute offset into dst.
  void read_bytes(int64_t offset, int64_t size, void* dst) const;
  /// The whole tensor, as stored.
  at::Tensor read(const std::string& name) const;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, TensorEntry> entries_;
};

/// What write_safetensors wrote for one tensor.
struct WrittenTensor {
  TensorEntry entry{};            ///< where it lies in the file
  std::vector<uint32_t> crc32{};  ///< chunk_checksums of its bytes
};

/// Writes the (CPU) tensors in order to path via path.tmp + rename, so a crash never leaves a
/// partial file under the final name. Returns each tensor's entry and checksums.
std::vector<WrittenTensor> write_safetensors(const std::filesystem::path& path,
                                             const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                             const std::map<std::string, std::string>& metadata = {});

/// Writes text to path via path.tmp + rename.
void write_file_atomically(const std::filesystem::path& path, const std::string& text);

/// Reads the rectangle [offset, offset + shape) of a stored tensor whose own rectangle in the
/// global tensor starts at stored_offset; the bytes read are the span covering the rectangle,
/// rounded out to checksum chunks and verified against crc32 when given (a mismatch names the
/// file and `what`). Returns a tensor of the stored dtype and `shape`.
at::Tensor read_region(const SafetensorsFile& file, const TensorEntry& entry, const std::vector<int64_t>& stored_offset,
                       const std::vector<int64_t>& offset, const std::vector<int64_t>& shape,
                       const std::vector<uint32_t>* crc32, const std::string& what);

}  // namespace titan::checkpoint
