// SPDX-License-Identifier: BSD-3-Clause
// The zip container as PKWARE's APPNOTE describes it (local headers, central directory, end records, ZIP64 where a
// size or offset passes 32 bits); the data.pkl layout as torch/serialization.py's _save writes it.
#include "torch_save.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <zlib.h>

#include <array>
#include <cstring>
#include <map>
#include <optional>

#include "titan/core/error.hpp"

namespace titan::checkpoint::detail {
namespace {

struct StorageDtype {
  const char* storage;  // torch.<X>Storage
  at::ScalarType type;
};
constexpr std::array<StorageDtype, 10> kStorages = {{{"FloatStorage", at::kFloat},
                                                     {"BFloat16Storage", at::kBFloat16},
                                                     {"HalfStorage", at::kHalf},
                                                     {"DoubleStorage", at::kDouble},
                                                     {"LongStorage", at::kLong},
                                                     {"IntStorage", at::kInt},
                                                     {"ShortStorage", at::kShort},
                                                     {"CharStorage", at::kChar},
                                                     {"ByteStorage", at::kByte},
                                                     {"BoolStorage", at::kBool}}};

std::optional<at::ScalarType> storage_dtype(const std::string& name) {
  for (const auto& d : kStorages) {
    if (name == d.storage) return d.type;
  }
  return std::nullopt;
}

[[noreturn]] void refuse_archive(const std::string& what, const std::string& expected, const std::string& got) {
  TITAN_CHECK_VALUE(false,
                    "[titan::checkpoint::torch_save] expected {}, got {} in {}. The checkpoint is corrupt or was not "
                    "written by torch.save; refusing it.",
                    expected, got, what);
  std::abort();  // unreachable
}

uint64_t zip_le(std::string_view s, size_t at, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}

// The stored entries of a zip archive by name.
std::map<std::string, std::string_view> zip_entries(std::string_view zip, const std::string& what) {
  constexpr size_t kEnd = 22;
  if (zip.size() < kEnd) refuse_archive(what, "a zip archive", fmt::format("{} bytes", zip.size()));
  size_t end = zip.size() - kEnd;  // the end record, before a comment of up to 64 KiB
  while (zip_le(zip, end, 4) != 0x06054b50) {
    if (end == 0 || zip.size() - end > kEnd + 0xffff) refuse_archive(what, "a zip end record", "none");
    --end;
  }
  uint64_t count = zip_le(zip, end + 10, 2), dir = zip_le(zip, end + 16, 4);
  if ((count == 0xffff || dir == 0xffffffff) && end >= 20 && zip_le(zip, end - 20, 4) == 0x07064b50) {
    const uint64_t end64 = zip_le(zip, end - 20 + 8, 8);  // the ZIP64 end record
    if (end64 + 56 > zip.size() || zip_le(zip, end64, 4) != 0x06064b50)
      refuse_archive(what, "a ZIP64 end record", "none");
    count = zip_le(zip, end64 + 32, 8);
    dir = zip_le(zip, end64 + 48, 8);
  }
  std::map<std::string, std::string_view> out;
  size_t at = dir;
  for (uint64_t i = 0; i < count; ++i) {
    if (at + 46 > zip.size() || zip_le(zip, at, 4) != 0x02014b50) refuse_archive(what, "a zip directory entry", "none");
    const uint64_t method = zip_le(zip, at + 10, 2);
    uint64_t size = zip_le(zip, at + 24, 4), compressed = zip_le(zip, at + 20, 4), local = zip_le(zip, at + 42, 4);
    const size_t name_len = zip_le(zip, at + 28, 2), extra_len = zip_le(zip, at + 30, 2),
                 comment_len = zip_le(zip, at + 32, 2);
    if (at + 46 + name_len + extra_len > zip.size()) refuse_archive(what, "a zip directory entry", "a truncated one");
    std::string name(zip.substr(at + 46, name_len));
    // ZIP64: the fields at their 32-bit maximum follow in order in extra field 0x0001.
    for (size_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const uint64_t id = zip_le(zip, x, 2), len = zip_le(zip, x + 2, 2);
      size_t f = x + 4;
      if (id == 1) {
        for (uint64_t* field : {&size, &compressed, &local}) {
          if (*field == 0xffffffff && f + 8 <= x + 4 + len) {
            *field = zip_le(zip, f, 8);
            f += 8;
          }
        }
      }
      x += 4 + len;
    }
    if (method != 0 || size != compressed)
      refuse_archive(what, fmt::format("'{}' stored uncompressed (as torch.save writes it)", name),
                     fmt::format("compression method {}", method));
    if (local + 30 > zip.size() || zip_le(zip, local, 4) != 0x04034b50)
      refuse_archive(what, "a zip local header", name);
    const uint64_t data = local + 30 + zip_le(zip, local + 26, 2) + zip_le(zip, local + 28, 2);
    if (data > zip.size() || size > zip.size() - data)
      refuse_archive(what, fmt::format("'{}' inside the archive", name), "a range past its end");
    out.emplace(std::move(name), zip.substr(data, size));
    at += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

// <archive>/data.pkl and the archive's folder name ("archive/" for torch.save, any single top folder allowed).
std::pair<std::string, std::string_view> data_pkl(const std::map<std::string, std::string_view>& entries,
                                                  const std::string& what) {
  for (const auto& [name, bytes] : entries) {
    if (name.ends_with("/data.pkl") && name.find('/') == name.size() - 9)
      return {name.substr(0, name.size() - 8), bytes};
  }
  refuse_archive(what, "<archive>/data.pkl", "no such entry");
}

std::vector<int64_t> archive_ints(const PyRef& tuple, const std::string& what, const char* field) {
  if (tuple->kind != PyValue::Kind::kTuple) refuse_archive(what, fmt::format("a tuple {}", field), tuple->describe());
  std::vector<int64_t> out;
  for (const auto& v : tuple->items) {
    if (v->kind != PyValue::Kind::kInt) refuse_archive(what, fmt::format("ints in {}", field), v->describe());
    out.push_back(v->integer);
  }
  return out;
}

// ---- writing --------------------------------------------------------------------------------------------

void zip_put(std::string& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A zip of stored entries, each entry's data 64-byte aligned (torch's kFieldAlignment) through padding in its local
// header's extra field, as torch's PyTorchStreamWriter does. Archives here stay far below 4 GiB per entry only when
// the tensor does; ZIP64 fields are written for every entry so any size round-trips.
std::string zip_archive(const std::vector<std::pair<std::string, std::string_view>>& entries) {
  std::string out, dir;
  for (const auto& [name, data] : entries) {
    const uint64_t local = out.size();
    const auto crc = static_cast<uint32_t>(
        crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data.data()), data.size()));
    // Local header: ZIP64 sizes in the extra field (id 1), then padding (id 0x4246 "FB", torch's) to align data.
    const size_t fixed = 30 + name.size() + 4 + 16 + 4;
    const size_t pad = (64 - (local + fixed) % 64) % 64;
    zip_put(out, 0x04034b50, 4);
    zip_put(out, 45, 2);  // version needed: ZIP64
    zip_put(out, 0, 2);
    zip_put(out, 0, 2);  // stored
    zip_put(out, 0, 4);  // time, date
    zip_put(out, crc, 4);
    zip_put(out, 0xffffffff, 4);
    zip_put(out, 0xffffffff, 4);
    zip_put(out, name.size(), 2);
    zip_put(out, 4 + 16 + 4 + pad, 2);
    out += name;
    zip_put(out, 1, 2);
    zip_put(out, 16, 2);
    zip_put(out, data.size(), 8);
    zip_put(out, data.size(), 8);
    zip_put(out, 0x4246, 2);
    zip_put(out, pad, 2);
    out.append(pad, 'Z');
    out.append(data);
    // Its central directory entry: sizes and offset in ZIP64 too.
    zip_put(dir, 0x02014b50, 4);
    zip_put(dir, 45, 2);
    zip_put(dir, 45, 2);
    zip_put(dir, 0, 2);
    zip_put(dir, 0, 2);
    zip_put(dir, 0, 4);
    zip_put(dir, crc, 4);
    zip_put(dir, 0xffffffff, 4);
    zip_put(dir, 0xffffffff, 4);
    zip_put(dir, name.size(), 2);
    zip_put(dir, 4 + 24, 2);
    zip_put(dir, 0, 2);  // comment
    zip_put(dir, 0, 2);  // disk
    zip_put(dir, 0, 2);  // internal attributes
    zip_put(dir, 0, 4);  // external attributes
    zip_put(dir, 0xffffffff, 4);
    dir += name;
    zip_put(dir, 1, 2);
    zip_put(dir, 24, 2);
    zip_put(dir, data.size(), 8);
    zip_put(dir, data.size(), 8);
    zip_put(dir, local, 8);
  }
  const uint64_t dir_at = out.size();
  out += dir;
  const uint64_t end64 = out.size();
  zip_put(out, 0x06064b50, 4);  // ZIP64 end record
  zip_put(out, 44, 8);
  zip_put(out, 45, 2);
  zip_put(out, 45, 2);
  zip_put(out, 0, 4);
  zip_put(out, 0, 4);
  zip_put(out, entries.size(), 8);
  zip_put(out, entries.size(), 8);
  zip_put(out, dir.size(), 8);
  zip_put(out, dir_at, 8);
  zip_put(out, 0x07064b50, 4);  // its locator
  zip_put(out, 0, 4);
  zip_put(out, end64, 8);
  zip_put(out, 1, 4);
  zip_put(out, 0x06054b50, 4);  // end record
  zip_put(out, 0, 4);
  zip_put(out, 0xffff, 2);
  zip_put(out, 0xffff, 2);
  zip_put(out, 0xffffffff, 4);
  zip_put(out, 0xffffffff, 4);
  zip_put(out, 0, 2);
  return out;
}

std::string torch_archive(const std::string& pkl, const std::string* storage) {
  std::vector<std::pair<std::string, std::string_view>> entries = {{"archive/data.pkl", pkl},
                                                                   {"archive/byteorder", "little"}};
  if (storage != nullptr) entries.emplace_back("archive/data/0", *storage);
  entries.emplace_back("archive/version", "3\n");
  return zip_archive(entries);
}

}  // namespace

PyRef read_saved_object(std::string_view archive_bytes, const std::string& what) {
  const auto entries = zip_entries(archive_bytes, what);
  const auto [folder, pkl] = data_pkl(entries, what);
  // Plain data only: the objects torchtitan's state dicts hold (ints, floats, bools, str, bytes, lists, tuples).
  return unpickle(
      pkl,
      [](const std::string& module, const std::string& name) {
        return module == "collections" && name == "OrderedDict";
      },
      what);
}

at::Tensor read_saved_tensor(std::string_view archive_bytes, const std::string& what) {
  const auto entries = zip_entries(archive_bytes, what);
  const auto [folder, pkl] = data_pkl(entries, what);
  const PyRef root = unpickle(
      pkl,
      [](const std::string& module, const std::string& name) {
        return (module == "torch._utils" && name == "_rebuild_tensor_v2") ||
               (module == "torch" && storage_dtype(name).has_value()) ||
               (module == "collections" && name == "OrderedDict");
      },
      what, /*persistent=*/true);
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks)
  if (root->class_name() != "torch._utils._rebuild_tensor_v2" || root->items.size() < 4)
    refuse_archive(what, "torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)", root->describe());
  const PyRef& pid = root->items[0];
  if (pid->kind != PyValue::Kind::kPersistentId || pid->items[0]->kind != PyValue::Kind::kTuple ||
      pid->items[0]->items.size() != 5)
    refuse_archive(what, "a storage ('storage', type, key, location, numel)", pid->describe());
  const auto& id = pid->items[0]->items;
  if (id[1]->kind != PyValue::Kind::kGlobal || id[2]->kind != PyValue::Kind::kStr || id[4]->kind != PyValue::Kind::kInt)
    refuse_archive(what, "a storage ('storage', type, key, location, numel)", "other fields");
  const at::ScalarType dtype = *storage_dtype(id[1]->text.substr(id[1]->text.rfind('.') + 1));
  const int64_t numel = id[4]->integer;
  const auto data = entries.find(folder + "data/" + id[2]->text);
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  if (data == entries.end() || numel < 0 || static_cast<int64_t>(data->second.size()) != bytes)
    refuse_archive(what, fmt::format("{}data/{} of {} bytes", folder, id[2]->text, bytes),
                   data == entries.end() ? "no such entry" : fmt::format("{} bytes", data->second.size()));
  if (root->items[1]->kind != PyValue::Kind::kInt)
    refuse_archive(what, "an int storage offset", root->items[1]->describe());
  const int64_t offset = root->items[1]->integer;
  const std::vector<int64_t> size = archive_ints(root->items[2], what, "size"),
                             stride = archive_ints(root->items[3], what, "stride");
  if (size.size() != stride.size())
    refuse_archive(what, "a stride per dimension", fmt::format("{} for {}", stride.size(), size.size()));
  int64_t last = offset;  // the largest element index the view reaches
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] < 0 || stride[d] < 0)
      refuse_archive(what, "non-negative sizes and strides", c10::str(size, " ", stride));
    if (size[d] == 0) last = -1;
    if (last >= 0) last += (size[d] - 1) * stride[d];
  }
  if (offset < 0 || last >= numel)
    refuse_archive(what, fmt::format("a view inside its {} elements", numel), fmt::format("element {}", last));
  at::Tensor storage = at::empty({numel}, at::TensorOptions().dtype(dtype));  // (numel,)
  if (bytes > 0) std::memcpy(storage.data_ptr(), data->second.data(), static_cast<size_t>(bytes));
  return storage.as_strided(size, stride, offset).clone();
}

std::string save_object(const PyValue& object) { return torch_archive(pickle(object), nullptr); }

std::string save_tensor(const at::Tensor& tensor) {
  const at::Tensor t = tensor.detach().cpu().contiguous();
  std::optional<std::string> storage_name;
  for (const auto& d : kStorages) {
    if (d.type == t.scalar_type()) storage_name = d.storage;
  }
  TITAN_CHECK_VALUE(storage_name.has_value(),
                    "[titan::checkpoint::torch_save] expected a dtype torch.save names, got {}.",
                    c10::toString(t.scalar_type()));
  const std::string storage(static_cast<const char*>(t.data_ptr()), t.nbytes());
  std::vector<PyRef> size, stride;
  for (int64_t d = 0; d < t.dim(); ++d) {
    size.push_back(py_int(t.size(d)));
    stride.push_back(py_int(t.stride(d)));
  }
  const PyRef id =
      py_tuple({py_str("storage"), py_global("torch." + *storage_name), py_str("0"), py_str("cpu"), py_int(t.numel())});
  // BINPERSID is not a value the generic writer emits: the pickle is spelled out here, as torch's _save does.
  std::string pkl = "\x80\x02";
  pkl += "ctorch._utils\n_rebuild_tensor_v2\n(";
  const std::string id_pickle = pickle(*id);
  pkl += id_pickle.substr(2, id_pickle.size() - 3);  // the tuple's opcodes, without PROTO and STOP
  pkl += 'Q';                                        // BINPERSID
  const std::string rest = pickle(*py_tuple({py_int(0), py_tuple(size), py_tuple(stride), py_bool(false),
                                             py_call(py_global("collections.OrderedDict"), {})}));
  // The remaining arguments, spliced into the outer tuple: drop PROTO, the inner "(" and "t", and STOP.
  pkl += rest.substr(3, rest.size() - 5);
  pkl += "tR.";
  return torch_archive(pkl, &storage);
}

}  // namespace titan::checkpoint::detail
