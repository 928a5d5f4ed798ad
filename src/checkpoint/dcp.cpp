// SPDX-License-Identifier: BSD-3-Clause
// Metadata's fields as torch 2.11's torch/distributed/checkpoint/metadata.py and filesystem.py (_StorageInfo)
// define and pickle them: dataclasses through NEWOBJ + BUILD of their __dict__, TensorProperties through its
// __getstate__ tuple (dtype, layout, requires_grad, memory format encoding, pin_memory), torch.Size through REDUCE.
#include "titan/checkpoint/dcp.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <optional>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/error.hpp"
#include "torch_save.hpp"

namespace titan::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr const char* kDcpMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr const char* kDcpStorageInfo = "torch.distributed.checkpoint.filesystem._StorageInfo";
constexpr const char* kDcpDataFile = "__0_0.distcp";

struct TorchDtypeName {
  const char* name;
  at::ScalarType type;
};
// torch's dtype attributes, the canonical name first for each type (what the writer uses).
constexpr std::array<TorchDtypeName, 16> kTorchDtypes = {{{"float32", at::kFloat},
                                                          {"float", at::kFloat},
                                                          {"bfloat16", at::kBFloat16},
                                                          {"float16", at::kHalf},
                                                          {"half", at::kHalf},
                                                          {"float64", at::kDouble},
                                                          {"double", at::kDouble},
                                                          {"int64", at::kLong},
                                                          {"long", at::kLong},
                                                          {"int32", at::kInt},
                                                          {"int", at::kInt},
                                                          {"int16", at::kShort},
                                                          {"short", at::kShort},
                                                          {"int8", at::kChar},
                                                          {"uint8", at::kByte},
                                                          {"bool", at::kBool}}};

std::optional<at::ScalarType> dtype_named(const std::string& name) {
  for (const auto& d : kTorchDtypes) {
    if (name == d.name) return d.type;
  }
  return std::nullopt;
}

// The classes a DCP .metadata holds, and nothing else.
bool metadata_global(const std::string& module, const std::string& name) {
  static const std::array<const char*, 8> kMetadataClasses = {
      "Metadata",         "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
      "TensorProperties", "MetadataIndex",         "StorageMeta",          "_MEM_FORMAT_ENCODING"};
  if (module == kDcpMetadataModule)
    return std::find(kMetadataClasses.begin(), kMetadataClasses.end(), name) != kMetadataClasses.end();
  if (module == "torch.distributed.checkpoint.filesystem") return name == "_StorageInfo";
  if (module == "torch") return name == "Size" || dtype_named(name).has_value();
  if (module == "torch.serialization") return name == "_get_layout";
  if (module == "pathlib") return name == "PosixPath" || name == "PurePosixPath";  // storage_meta.checkpoint_id
  return module == "collections" && name == "OrderedDict";
}

// Reads the metadata tree, refusing what is not the shape DCP writes, naming the file and the entry.
class MetadataWalker {
 public:
  explicit MetadataWalker(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void refuse(const std::string& where, const std::string& expected, const PyRef& got) const {
    TITAN_CHECK_VALUE(false,
                      "[titan::checkpoint::dcp] expected {} at {} of '{}', got {}. The metadata is corrupt or not "
                      "torch.distributed.checkpoint's; refusing to read the checkpoint.",
                      expected, where, path_, got ? got->describe() : "nothing");
    std::abort();  // unreachable
  }
  // The __dict__ state of a dataclass instance of `cls` (in torch.distributed.checkpoint.metadata unless dotted).
  const PyValue& object(const PyRef& v, const std::string& where, const std::string& cls) const {
    const std::string full = cls.find('.') == std::string::npos ? fmt::format("{}.{}", kDcpMetadataModule, cls) : cls;
    if (!v || v->class_name() != full || !v->state || v->state->kind != PyValue::Kind::kDict)
      refuse(where, fmt::format("a {} object", full), v);
    return *v->state;
  }
  PyRef field(const PyValue& state, const std::string& where, const char* name) const {
    PyRef v = state.get(name);
    if (!v) refuse(where, fmt::format("a field '{}'", name), nullptr);
    return v;
  }
  int64_t integer(const PyRef& v, const std::string& where) const {
    if (!v || v->kind != PyValue::Kind::kInt || v->integer < 0) refuse(where, "a non-negative int", v);
    return v->integer;
  }
  std::string string(const PyRef& v, const std::string& where) const {
    if (!v || v->kind != PyValue::Kind::kStr) refuse(where, "a str", v);
    return v->text;
  }
  std::vector<int64_t> size(const PyRef& v, const std::string& where) const {
    if (!v || v->class_name() != "torch.Size" || v->items.size() != 1 || v->items[0]->kind != PyValue::Kind::kTuple)
      refuse(where, "a torch.Size", v);
    std::vector<int64_t> out;
    for (const auto& d : v->items[0]->items) out.push_back(integer(d, where));
    return out;
  }
  const std::vector<std::pair<PyRef, PyRef>>& dict(const PyRef& v, const std::string& where) const {
    if (!v || v->kind != PyValue::Kind::kDict) refuse(where, "a dict", v);
    return v->entries;
  }

 private:
  std::string path_;
};

// ---- writing --------------------------------------------------------------------------------------------

PyRef meta_class(const char* name) { return py_global(fmt::format("{}.{}", kDcpMetadataModule, name)); }
PyRef dcp_dataclass(PyRef cls, std::vector<std::pair<PyRef, PyRef>> fields) {
  return py_call(std::move(cls), {}, py_dict(std::move(fields)), /*new_object=*/true);
}
PyRef torch_size(const std::vector<int64_t>& dims) {
  std::vector<PyRef> items;
  for (int64_t d : dims) items.push_back(py_int(d));
  return py_call(py_global("torch.Size"), {py_tuple(std::move(items))});
}
PyRef tensor_metadata(const at::Tensor& t) {
  const char* dtype = nullptr;
  for (const auto& d : kTorchDtypes) {
    if (dtype == nullptr && d.type == t.scalar_type()) dtype = d.name;
  }
  TITAN_CHECK_VALUE(dtype != nullptr, "[titan::checkpoint::dcp] expected a dtype torch names, got {}.",
                    c10::toString(t.scalar_type()));
  // TensorProperties.__setstate__'s tuple: dtype, layout, requires_grad, memory format (0: contiguous), pin_memory.
  const PyRef properties =
      py_call(meta_class("TensorProperties"), {},
              py_tuple({py_global(fmt::format("torch.{}", dtype)),
                        py_call(py_global("torch.serialization._get_layout"), {py_str("torch.strided")}),
                        py_bool(false), py_call(meta_class("_MEM_FORMAT_ENCODING"), {py_int(0)}), py_bool(false)}),
              /*new_object=*/true);
  const std::vector<int64_t> shape = t.sizes().vec(), origin(shape.size(), 0);
  const PyRef chunk = dcp_dataclass(meta_class("ChunkStorageMetadata"),
                                    {{py_str("offsets"), torch_size(origin)}, {py_str("sizes"), torch_size(shape)}});
  return dcp_dataclass(
      meta_class("TensorStorageMetadata"),
      {{py_str("properties"), properties}, {py_str("size"), torch_size(shape)}, {py_str("chunks"), py_list({chunk})}});
}

std::string join_path(const std::vector<std::string>& path) {
  std::string out;
  for (const auto& p : path) out += (out.empty() ? "" : ".") + p;
  return out;
}

}  // namespace

DcpReader::DcpReader(fs::path folder) : folder_(std::move(folder)) {
  const fs::path path = folder_ / ".metadata";
  std::ifstream in(path, std::ios::binary);
  TITAN_CHECK_VALUE(in.good(),
                    "[titan::checkpoint::dcp] expected a torch.distributed.checkpoint folder with .metadata, got none "
                    "in '{}'. Give the step folder (<dump>/checkpoint/step-N).",
                    folder_.string());
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const MetadataWalker w(path.string());
  const PyRef root = unpickle(bytes, metadata_global, fmt::format("'{}'", path.string()));
  const PyValue& meta = w.object(root, "the top level", "Metadata");
  // Items and their metadata.
  for (const auto& [k, v] : w.dict(w.field(meta, "Metadata", "state_dict_metadata"), "state_dict_metadata")) {
    const std::string key = w.string(k, "a key of state_dict_metadata");
    const std::string at = fmt::format("state_dict_metadata['{}']", key);
    if (v && v->class_name() == fmt::format("{}.BytesStorageMetadata", kDcpMetadataModule)) {
      objects_.push_back(key);
      continue;
    }
    const PyValue& tensor = w.object(v, at, "TensorStorageMetadata");
    const PyRef props = w.field(tensor, at, "properties");
    if (props->class_name() != fmt::format("{}.TensorProperties", kDcpMetadataModule) || !props->state ||
        props->state->kind != PyValue::Kind::kTuple || props->state->items.empty() ||
        props->state->items[0]->kind != PyValue::Kind::kGlobal)
      w.refuse(at + ".properties", "TensorProperties (dtype, layout, ...)", props);
    const std::optional<at::ScalarType> dtype = dtype_named(props->state->items[0]->text.substr(6));  // torch.<dtype>
    if (!dtype) w.refuse(at + ".properties", "a torch dtype", props->state->items[0]);
    TensorInfo info{.dtype = *dtype};
    info.shape = w.size(w.field(tensor, at, "size"), at + ".size");
    std::vector<Chunk> chunks;
    const PyRef list = w.field(tensor, at, "chunks");
    if (list->kind != PyValue::Kind::kList) w.refuse(at + ".chunks", "a list", list);
    for (size_t i = 0; i < list->items.size(); ++i) {
      const std::string cat = fmt::format("{}.chunks[{}]", at, i);
      const PyValue& chunk = w.object(list->items[i], cat, "ChunkStorageMetadata");
      Chunk c{.offsets = w.size(w.field(chunk, cat, "offsets"), cat + ".offsets"),
              .sizes = w.size(w.field(chunk, cat, "sizes"), cat + ".sizes")};
      if (c.offsets.size() != info.shape.size() || c.sizes.size() != info.shape.size()) {
        w.refuse(cat, fmt::format("offsets and sizes of rank {}", info.shape.size()), list->items[i]);
      }
      for (size_t d = 0; d < info.shape.size(); ++d) {
        if (c.offsets[d] > info.shape[d] || c.sizes[d] > info.shape[d] - c.offsets[d])
          w.refuse(cat, fmt::format("a rectangle inside {}", c10::str(info.shape)), list->items[i]);
      }
      chunks.push_back(std::move(c));
    }
    tensors_.emplace(key, std::move(info));
    chunks_.emplace(key, std::move(chunks));
  }
  // Where each chunk and item lies: MetadataIndex(fqn, offset of the chunk or None) -> _StorageInfo.
  std::map<std::pair<std::string, std::vector<int64_t>>, Location> where;
  for (const auto& [k, v] : w.dict(w.field(meta, "Metadata", "storage_data"), "storage_data")) {
    const PyValue& index = w.object(k, "a key of storage_data", "MetadataIndex");
    const std::string fqn = w.string(w.field(index, "MetadataIndex", "fqn"), "MetadataIndex.fqn");
    const std::string at = fmt::format("storage_data['{}']", fqn);
    const PyRef offset = index.get("offset");
    const std::vector<int64_t> offsets =
        offset && offset->kind != PyValue::Kind::kNone ? w.size(offset, at + ".offset") : std::vector<int64_t>{-1};
    const PyValue& info = w.object(v, at, kDcpStorageInfo);
    Location loc{.file = w.string(w.field(info, at, "relative_path"), at + ".relative_path"),
                 .offset = w.integer(w.field(info, at, "offset"), at + ".offset"),
                 .length = w.integer(w.field(info, at, "length"), at + ".length")};
    if (!is_plain_file_name(loc.file))
      w.refuse(at + ".relative_path", "a file inside the checkpoint folder", w.field(info, at, "relative_path"));
    const PyRef transforms = info.get("transform_descriptors");
    if (transforms && transforms->kind != PyValue::Kind::kNone &&
        !(transforms->kind == PyValue::Kind::kList && transforms->items.empty()))
      w.refuse(at + ".transform_descriptors", "none (titan reads items torch.save wrote as they are, no extensions)",
               transforms);
    where[{fqn, offsets}] = loc;
  }
  for (auto& [key, chunks] : chunks_) {
    for (Chunk& c : chunks) {
      const auto it = where.find({key, c.offsets});
      if (it == where.end())
        w.refuse(fmt::format("storage_data['{}']", key), fmt::format("the chunk at {}", c10::str(c.offsets)), nullptr);
      c.at = it->second;
    }
  }
  for (const std::string& key : objects_) {
    const auto it = where.find({key, {-1}});
    if (it == where.end()) w.refuse(fmt::format("storage_data['{}']", key), "the item's location", nullptr);
    object_at_[key] = it->second;
  }
}

std::string DcpReader::read_bytes(const Location& at, const std::string& key) const {
  const fs::path path = folder_ / at.file;
  std::error_code ec;
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  TITAN_CHECK_VALUE(
      !ec && at.offset <= size && at.length <= size - at.offset,
      "[titan::checkpoint::dcp] expected '{}' of at least {} bytes (item '{}' at bytes [{}, {})), got {}. "
      "The checkpoint is incomplete; copy it again.",
      path.string(), at.offset + at.length, key, at.offset, at.offset + at.length,
      ec ? std::string("no such file") : fmt::format("{} bytes", size));
  std::ifstream in(path, std::ios::binary);
  in.seekg(at.offset);
  std::string bytes(static_cast<size_t>(at.length), '\0');
  in.read(bytes.data(), at.length);
  TITAN_CHECK_VALUE(in.good(), "[titan::checkpoint::dcp] expected to read '{}' from '{}', got a read error.", key,
                    path.string());
  return bytes;
}

at::Tensor DcpReader::read_tensor(const std::string& key) const {
  const auto info = tensors_.find(key);
  TITAN_CHECK_VALUE(info != tensors_.end(), "[titan::checkpoint::dcp] expected a tensor '{}' in '{}', got none.", key,
                    folder_.string());
  at::Tensor whole = at::zeros(info->second.shape, at::TensorOptions().dtype(info->second.dtype));  // global shape
  int64_t covered = 0;
  for (const Chunk& c : chunks_.at(key)) {
    const std::string what =
        fmt::format("'{}' (chunk at {} of '{}')", key, c10::str(c.offsets), (folder_ / c.at.file).string());
    const at::Tensor part = detail::read_saved_tensor(read_bytes(c.at, key), what);
    TITAN_CHECK_VALUE(part.sizes().vec() == c.sizes && part.scalar_type() == info->second.dtype,
                      "[titan::checkpoint::dcp] expected {} {} as the metadata records it, got {} {} in {}.",
                      c10::toString(info->second.dtype), c10::str(c.sizes), c10::toString(part.scalar_type()),
                      c10::str(part.sizes()), what);
    at::Tensor dst = whole;
    for (size_t d = 0; d < c.sizes.size(); ++d) dst = dst.narrow(static_cast<int64_t>(d), c.offsets[d], c.sizes[d]);
    dst.copy_(part);
    covered += part.numel();
  }
  TITAN_CHECK_VALUE(covered == whole.numel(),
                    "[titan::checkpoint::dcp] expected the chunks of '{}' in '{}' to cover its {} elements, got {}. "
                    "The metadata is inconsistent; refusing it.",
                    key, folder_.string(), whole.numel(), covered);
  return whole;
}

PyRef DcpReader::read_object(const std::string& key) const {
  const auto at = object_at_.find(key);
  TITAN_CHECK_VALUE(at != object_at_.end(), "[titan::checkpoint::dcp] expected an item '{}' in '{}', got none.", key,
                    folder_.string());
  return detail::read_saved_object(read_bytes(at->second, key),
                                   fmt::format("'{}' of '{}'", key, (folder_ / at->second.file).string()));
}

void write_dcp(const fs::path& folder, const std::vector<DcpEntry>& entries) {
  write_folder_atomically(folder, [&](const fs::path& tmp) {
    std::vector<std::pair<PyRef, PyRef>> items, storage, planner;
    std::ofstream out(tmp / kDcpDataFile, std::ios::binary);
    int64_t offset = 0;
    for (const DcpEntry& e : entries) {
      const std::string key = join_path(e.path);
      const std::string archive = e.tensor.defined() ? detail::save_tensor(e.tensor) : detail::save_object(*e.object);
      out.write(archive.data(), static_cast<std::streamsize>(archive.size()));
      const bool tensor = e.tensor.defined();
      items.emplace_back(py_str(key),
                         tensor ? tensor_metadata(e.tensor) : dcp_dataclass(meta_class("BytesStorageMetadata"), {}));
      const PyRef index =
          dcp_dataclass(meta_class("MetadataIndex"),
                        {{py_str("fqn"), py_str(key)},
                         {py_str("offset"), tensor ? torch_size(std::vector<int64_t>(e.tensor.dim(), 0)) : py_none()},
                         {py_str("index"), tensor ? py_int(0) : py_none()}});
      storage.emplace_back(index, dcp_dataclass(py_global(kDcpStorageInfo),
                                                {{py_str("relative_path"), py_str(kDcpDataFile)},
                                                 {py_str("offset"), py_int(offset)},
                                                 {py_str("length"), py_int(static_cast<int64_t>(archive.size()))},
                                                 {py_str("transform_descriptors"), py_none()}}));
      std::vector<PyRef> path;
      for (const auto& p : e.path) path.push_back(py_str(p));
      planner.emplace_back(py_str(key), py_tuple(std::move(path)));
      offset += static_cast<int64_t>(archive.size());
    }
    out.close();
    TITAN_CHECK_VALUE(out.good(), "[titan::checkpoint::dcp] expected to write '{}', got a write error (disk full?).",
                      (tmp / kDcpDataFile).string());
    const PyRef storage_meta = dcp_dataclass(meta_class("StorageMeta"), {{py_str("checkpoint_id"), py_none()},
                                                                         {py_str("save_id"), py_str("titan-convert")},
                                                                         {py_str("load_id"), py_none()},
                                                                         {py_str("modules"), py_list({})}});
    const PyRef meta =
        dcp_dataclass(meta_class("Metadata"), {{py_str("state_dict_metadata"), py_dict(std::move(items))},
                                               {py_str("planner_data"), py_dict(std::move(planner))},
                                               {py_str("storage_data"), py_dict(std::move(storage))},
                                               {py_str("storage_meta"), storage_meta},
                                               {py_str("version"), py_str("1.0.0")}});
    write_file_atomically(tmp / ".metadata", pickle(*meta));
  });
}

}  // namespace titan::checkpoint
