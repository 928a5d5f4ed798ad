// SPDX-License-Identifier: BSD-3-Clause
// The sharded format: see checkpoint.hpp. index.json:
//   {"format": "titan-checkpoint", "version": 1, "step": N, "world_size": W,
//    "files": {"rank-00000.safetensors": bytes, ...},
//    "tensors": {key: {"dtype", "global_shape", "placements",
//                      "shards": [{"file", "offset", "shape", "begin", "end", "crc32": [...]}]}},
//    "values": {group: JSON}}
#include "titan/checkpoint/checkpoint.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <thread>

#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/optim/optimizer.hpp"

namespace titan::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr int kFormatVersion = 1;

std::string rank_file(int64_t rank) { return fmt::format("rank-{:05d}.safetensors", rank); }
std::string rank_json(int64_t rank) { return fmt::format("rank-{:05d}.json", rank); }

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  TITAN_CHECK_VALUE(in.good(), "[titan::checkpoint] expected '{}', got none.", path.string());
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  TITAN_CHECK_VALUE(!j.is_discarded(), "[titan::checkpoint] expected JSON in '{}', got unparsable text (corrupt).",
                    path.string());
  return j;
}

fs::path file_in(const fs::path& folder, const std::string& name, const std::string& entry) {
  TITAN_CHECK_VALUE(is_plain_file_name(name),
                    "[titan::checkpoint] expected {} of '{}' to name a file inside the checkpoint folder, got '{}'. "
                    "The index is corrupt or hostile; refusing to read it. Load another checkpoint.",
                    entry, (folder / "index.json").string(), name);
  return folder / name;
}

// ---- the index, checked before anything is read or allocated ----------------------------------------

struct ShardRecord {
  std::string file;
  std::vector<int64_t> offset{};  // in the global tensor
  std::vector<int64_t> shape{};
  int64_t begin = 0;  // absolute byte range in file
  int64_t end = 0;
  std::vector<uint32_t> crc32{};
};

struct TensorRecord {
  std::string dtype;
  std::vector<int64_t> global_shape{};
  std::vector<ShardRecord> shards{};
};

struct Index {
  std::map<std::string, int64_t> files{};  // name -> bytes
  std::map<std::string, TensorRecord> tensors{};
  nlohmann::json values = nlohmann::json::object();
  int64_t step = 0;
};

// Reads index.json's fields by path (`tensors["model.w"].shards[0].begin`), refusing anything malformed with
// the file and the entry named.
class IndexReader {
 public:
  explicit IndexReader(fs::path path) : path_(std::move(path)) {}

  [[noreturn]] void refuse(const std::string& where, const std::string& expected, const nlohmann::json& got) const {
    std::string shown = got.dump(-1, ' ', /*ensure_ascii=*/true);
    if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
    TITAN_CHECK_VALUE(false,
                      "[titan::checkpoint] expected {} at {} of '{}', got {}. The index is corrupt or hostile; "
                      "refusing to load it. Load another checkpoint (checkpoint.load_step).",
                      expected, where, path_.string(), shown);
    std::abort();  // unreachable: the check above throws
  }
  const nlohmann::json& field(const nlohmann::json& object, const std::string& where, const char* key) const {
    if (!object.is_object()) refuse(where, "an object", object);
    const auto it = object.find(key);
    if (it == object.end()) refuse(where, fmt::format("a field \"{}\"", key), object);
    return *it;
  }
  int64_t integer(const nlohmann::json& v, const std::string& where, int64_t lo = 0,
                  int64_t hi = std::numeric_limits<int64_t>::max()) const {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) ||
        v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
      refuse(where, fmt::format("an integer in [{}, {}]", lo, hi), v);
    }
    return v.get<int64_t>();
  }
  std::vector<int64_t> dims(const nlohmann::json& v, const std::string& where, size_t rank) const {
    if (!v.is_array() || v.size() != rank) refuse(where, fmt::format("an array of {} non-negative integers", rank), v);
    std::vector<int64_t> out;
    for (size_t d = 0; d < v.size(); ++d) out.push_back(integer(v[d], fmt::format("{}[{}]", where, d)));
    return out;
  }
  std::string string(const nlohmann::json& v, const std::string& where) const {
    if (!v.is_string()) refuse(where, "a string", v);
    return v.get<std::string>();
  }

  Index read(const nlohmann::json& j) const {
    Index index;
    if (!j.is_object()) refuse("the top level", "an object", j);
    const auto format = j.find("format"), version = j.find("version");
    TITAN_CHECK_VALUE(
        format != j.end() && *format == "titan-checkpoint" && version != j.end() && *version == kFormatVersion,
        "[titan::checkpoint::load] expected a titan-checkpoint index version {} in '{}', got format {} "
        "version {}.",
        kFormatVersion, path_.string(), format != j.end() ? format->dump() : "none",
        version != j.end() ? version->dump() : "none");
    index.step = integer(field(j, "the top level", "step"), "step");
    const auto& files = field(j, "the top level", "files");
    if (!files.is_object()) refuse("files", "an object {file: bytes}", files);
    for (const auto& [name, bytes] : files.items()) {
      if (!is_plain_file_name(name))
        refuse(fmt::format("files[\"{}\"]", name), "a file inside the checkpoint folder", name);
      index.files[name] = integer(bytes, fmt::format("files[\"{}\"]", name));
    }
    index.values = field(j, "the top level", "values");
    if (!index.values.is_object()) refuse("values", "an object {group: value}", index.values);
    const auto& tensors = field(j, "the top level", "tensors");
    if (!tensors.is_object()) refuse("tensors", "an object {key: tensor}", tensors);
    for (const auto& [key, t] : tensors.items()) {
      const std::string at = fmt::format("tensors[\"{}\"]", key);
      TensorRecord rec;
      rec.dtype = string(field(t, at, "dtype"), at + ".dtype");
      if (!is_safetensors_dtype(rec.dtype)) refuse(at + ".dtype", "a safetensors dtype titan reads", rec.dtype);
      const auto& global = field(t, at, "global_shape");
      if (!global.is_array() || global.size() > 64) refuse(at + ".global_shape", "an array of at most 64 dims", global);
      rec.global_shape = dims(global, at + ".global_shape", global.size());
      if (!detail::checked_nbytes(rec.global_shape, scalar_type(rec.dtype))) {
        refuse(at + ".global_shape", "a shape whose byte size fits in 63 bits", global);
      }
      const auto& shards = field(t, at, "shards");
      if (!shards.is_array()) refuse(at + ".shards", "an array", shards);
      for (size_t i = 0; i < shards.size(); ++i)
        rec.shards.push_back(shard(index, rec, shards[i], fmt::format("{}.shards[{}]", at, i)));
      index.tensors.emplace(key, std::move(rec));
    }
    return index;
  }

 private:
  // One shard: a rectangle inside the global shape, in a listed file, whose byte range holds exactly its
  // elements and lies inside the file's recorded size, with one checksum per chunk.
  ShardRecord shard(const Index& index, const TensorRecord& rec, const nlohmann::json& j, const std::string& at) const {
    ShardRecord s;
    s.file = string(field(j, at, "file"), at + ".file");
    if (!is_plain_file_name(s.file)) refuse(at + ".file", "a file inside the checkpoint folder", s.file);
    const auto listed = index.files.find(s.file);
    if (listed == index.files.end()) refuse(at + ".file", "a file listed under \"files\"", s.file);
    const size_t rank = rec.global_shape.size();
    s.offset = dims(field(j, at, "offset"), at + ".offset", rank);
    s.shape = dims(field(j, at, "shape"), at + ".shape", rank);
    for (size_t d = 0; d < rank; ++d) {
      if (s.offset[d] > rec.global_shape[d] || s.shape[d] > rec.global_shape[d] - s.offset[d]) {
        refuse(at, fmt::format("offset + shape inside the global shape {}", c10::str(rec.global_shape)), j);
      }
    }
    const int64_t bytes = *detail::checked_nbytes(s.shape, scalar_type(rec.dtype));  // <= the global size
    s.begin = integer(field(j, at, "begin"), at + ".begin", 0, listed->second);
    s.end = integer(field(j, at, "end"), at + ".end", s.begin, listed->second);
    if (s.end - s.begin != bytes) {
      refuse(at, fmt::format("end - begin = {} bytes ({} {})", bytes, rec.dtype, c10::str(s.shape)), j);
    }
    const auto& crc = field(j, at, "crc32");
    const size_t chunks =
        static_cast<size_t>(std::max<int64_t>(1, (bytes + kChecksumChunkBytes - 1) / kChecksumChunkBytes));
    if (!crc.is_array() || crc.size() != chunks)
      refuse(at + ".crc32", fmt::format("an array of {} checksums", chunks), crc);
    for (size_t i = 0; i < chunks; ++i) {
      s.crc32.push_back(static_cast<uint32_t>(integer(crc[i], fmt::format("{}.crc32[{}]", at, i), 0, UINT32_MAX)));
    }
    return s;
  }

  fs::path path_;
};

bool excluded(const std::string& key, const std::vector<std::string>& exclude) {
  return std::find(exclude.begin(), exclude.end(), group_of(key)) != exclude.end();
}

}  // namespace

std::string group_of(const std::string& key) { return key.substr(0, key.find('.')); }

bool is_model_group(const std::string& key) {
  const std::string group = group_of(key);
  return group == "model" || group == "lora";
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

StateTensor state_tensor(std::string key, const at::Tensor& p, const dist::Mesh* mesh, bool per_stage) {
  const parallel::ShardedParam* sp = parallel::sharded_param(p);
  StateTensor st;
  static_cast<parallel::TensorLayout&>(st) =
      sp ? static_cast<const parallel::TensorLayout&>(*sp) : parallel::TensorLayout::whole(p.sizes().vec());
  st.key = std::move(key);
  st.tensor = p;
  std::vector<std::string_view> sharded_axes;
  bool over_ep = false;     // expert-parallel: sharded over ep, copies on the efsdp ranks
  bool over_efsdp = false;  // ... unless FSDP split them again over efsdp
  for (const auto& [axis, placement] :
       sp ? sp->placements : std::vector<std::pair<std::string, parallel::Placement>>{}) {
    TITAN_CHECK_NOT_IMPLEMENTED(placement.kind != parallel::Placement::Kind::kPartial,
                                "[titan::checkpoint] expected '{}' sharded or replicated, got Partial() on {}. "
                                "Reduce it before saving.",
                                st.key, axis);
    if (placement.kind != parallel::Placement::Kind::kShard) continue;
    if (axis == "ep" || axis == "efsdp") {
      (axis == "ep" ? over_ep : over_efsdp) = true;
      continue;
    }
    // Expert tensor parallelism splits over the tp ranks themselves (etp = tp).
    for (auto base : dist::Mesh::base_axes(axis == "etp" ? "tp" : axis)) sharded_axes.push_back(base);
  }
  if (mesh != nullptr) {
    // Replicas of a region write it once; a stage's tensors have no replicas across pp.
    for (std::string_view axis : dist::Mesh::base_axes("world")) {
      if (axis == "pp" && per_stage) continue;
      if (over_ep && (axis == "dp_shard" || axis == "cp")) continue;  // ep x efsdp: efsdp decides below
      if (std::find(sharded_axes.begin(), sharded_axes.end(), axis) == sharded_axes.end() &&
          mesh->coordinate(axis) != 0) {
        st.owner = false;
      }
    }
    if (over_ep && !over_efsdp && mesh->coordinate("efsdp") != 0) st.owner = false;
  }
  return st;
}

void add_model(State& state, const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
               const dist::Mesh* mesh, const std::string& group) {
  TITAN_CHECK(names.size() == params.size(),
              "[titan::checkpoint::add_model] expected a name per parameter, got {} "
              "names for {} parameters.",
              names.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i)
    state.tensors.push_back(state_tensor(group + "." + names[i], params[i], mesh, /*per_stage=*/true));
}

void add_expert_biases(State& state, const torch::nn::Module& model, const std::string& group, const dist::Mesh* mesh) {
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    if (item.key().ends_with(".expert_bias"))
      state.tensors.push_back(state_tensor(group + "." + item.key(), item.value(), mesh));
  }
}

void add_optimizer(State& state, const std::vector<std::string>& names, const Optimizer& optimizer,
                   const dist::Mesh* mesh) {
  TITAN_CHECK(names.size() == optimizer.params().size(),
              "[titan::checkpoint::add_optimizer] expected a name per "
              "parameter, got {} names for {} parameters.",
              names.size(), optimizer.params().size());
  for (size_t i = 0; i < names.size(); ++i) {
    // State like the parameter shares its shard; any other state (a step counter) is one whole tensor.
    const StateTensor like = state_tensor("", optimizer.params()[i], mesh, /*per_stage=*/true);
    for (ParamState& s : optimizer.state(i)) {
      std::string key = fmt::format("optimizer.{}.{}", names[i], s.name);
      if (!s.like_param) {
        state.tensors.push_back(state_tensor(std::move(key), s.tensor, mesh, /*per_stage=*/true));
        continue;
      }
      TITAN_CHECK(s.tensor.sizes() == optimizer.params()[i].sizes(),
                  "[titan::checkpoint::add_optimizer] expected "
                  "state '{}' shaped like its parameter {}, got {}. Mark it like_param = false.",
                  key, c10::str(optimizer.params()[i].sizes()), c10::str(s.tensor.sizes()));
      StateTensor st = like;
      st.key = std::move(key);
      st.tensor = std::move(s.tensor);
      state.tensors.push_back(std::move(st));
    }
  }
}

State stage(const State& state, at::ScalarType model_dtype, const State* reuse) {
  State staged{.tensors = {}, .values = state.values};
  at::NoGradGuard no_grad;
  for (const auto& st : state.tensors) {
    if (!st.owner) continue;
    StateTensor copy = st;
    at::Tensor t = st.tensor.detach();
    for (size_t d = 0; d < st.local_shape.size(); ++d) t = t.narrow(static_cast<int64_t>(d), 0, st.local_shape[d]);
    const at::ScalarType dtype = is_model_group(st.key) ? model_dtype : t.scalar_type();
    // A host tensor of its own, never a view: training goes on changing the original. The previous
    // save's buffer when it fits (fresh pages cost a fault each); pinned when the source is on a
    // GPU, so the device-to-host copy runs at full bus speed.
    const size_t i = staged.tensors.size();
    at::Tensor host;
    if (reuse != nullptr && i < reuse->tensors.size() && reuse->tensors[i].key == st.key &&
        reuse->tensors[i].tensor.sizes() == t.sizes() && reuse->tensors[i].tensor.scalar_type() == dtype) {
      host = reuse->tensors[i].tensor;
    } else {
      host = at::empty(t.sizes(), at::TensorOptions().dtype(dtype).pinned_memory(t.is_cuda()));
    }
    host.copy_(t);
    copy.tensor = host;
    staged.tensors.push_back(std::move(copy));
  }
  return staged;
}

void write_rank_part(const fs::path& tmp_folder, int64_t rank, const State& staged) {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& st : staged.tensors) named.emplace_back(st.key, st.tensor);
  const std::string file = rank_file(rank);
  const std::vector<WrittenTensor> written = write_safetensors(tmp_folder / file, named);
  nlohmann::json part = {
      {"file", file}, {"bytes", fs::file_size(tmp_folder / file)}, {"tensors", nlohmann::json::object()}};
  for (size_t i = 0; i < written.size(); ++i) {
    const StateTensor& st = staged.tensors[i];
    part["tensors"][st.key] = {{"dtype", written[i].entry.dtype},   {"global_shape", st.global_shape},
                               {"placements", st.placements_str()}, {"offset", st.offset},
                               {"shape", st.tensor.sizes().vec()},  {"begin", written[i].entry.begin},
                               {"end", written[i].entry.end},       {"crc32", written[i].crc32}};
  }
  if (rank == 0) part["values"] = staged.values;
  write_file_atomically(tmp_folder / rank_json(rank), part.dump());
}

bool commit(const fs::path& tmp_folder, const fs::path& folder, int64_t world_size, int64_t step, double timeout_s,
            const std::atomic<bool>* cancel) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  nlohmann::json index = {
      {"format", "titan-checkpoint"},      {"version", kFormatVersion},         {"step", step},
      {"world_size", world_size},          {"files", nlohmann::json::object()}, {"tensors", nlohmann::json::object()},
      {"values", nlohmann::json::object()}};
  for (int64_t r = 0; r < world_size; ++r) {
    const fs::path part_path = tmp_folder / rank_json(r);
    // Ranks write their parts on their own (possibly background) threads; the file system is the
    // rendezvous, so an async save needs no collective off the training thread.
    while (!fs::exists(part_path)) {
      if (std::chrono::steady_clock::now() > deadline || (cancel != nullptr && cancel->load())) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const nlohmann::json part = read_json(part_path);
    index["files"][part.at("file").get<std::string>()] = part.at("bytes");
    for (const auto& [key, t] : part.at("tensors").items()) {
      auto& entry = index["tensors"][key];
      if (entry.is_null()) {
        entry = {{"dtype", t.at("dtype")},
                 {"global_shape", t.at("global_shape")},
                 {"placements", t.at("placements")},
                 {"shards", nlohmann::json::array()}};
      }
      entry["shards"].push_back({{"file", part.at("file")},
                                 {"offset", t.at("offset")},
                                 {"shape", t.at("shape")},
                                 {"begin", t.at("begin")},
                                 {"end", t.at("end")},
                                 {"crc32", t.at("crc32")}});
    }
    if (part.contains("values")) index["values"] = part.at("values");
  }
  write_file_atomically(tmp_folder / "index.json", index.dump());
  for (int64_t r = 0; r < world_size; ++r) fs::remove(tmp_folder / rank_json(r));
  if (fs::exists(folder)) fs::remove_all(folder);  // an older save of the same step (e.g. a re-run)
  fs::rename(tmp_folder, folder);
  return true;
}

void save(const fs::path& folder, const State& state, const dist::Mesh& mesh, int64_t step,
          at::ScalarType model_dtype) {
  const fs::path tmp = folder.parent_path() / fmt::format(".{}.tmp", folder.filename().string());
  if (mesh.rank() == 0) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  mesh.group("world").barrier();
  write_rank_part(tmp, mesh.rank(), stage(state, model_dtype));
  mesh.group("world").barrier();
  if (mesh.rank() == 0) {
    TITAN_CHECK(commit(tmp, folder, mesh.world_size(), step, 0.0),
                "[titan::checkpoint::save] expected every rank's "
                "part in '{}', got some missing after a barrier.",
                tmp.string());
  }
  mesh.group("world").barrier();
}

std::optional<std::string> check_complete(const fs::path& folder) {
  const fs::path index_path = folder / "index.json";
  if (!fs::exists(index_path)) return fmt::format("no index.json in '{}' (an interrupted save)", folder.string());
  std::ifstream in(index_path);
  const auto json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object() || !json.contains("files"))
    return fmt::format("'{}' is not a titan index", index_path.string());
  Index index;
  try {
    index = IndexReader(index_path).read(json);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  for (const auto& [file, bytes] : index.files) {
    const fs::path path = folder / file;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return fmt::format("shard '{}' listed in the index is missing", path.string());
    const auto size = static_cast<int64_t>(fs::file_size(path, ec));
    if (ec || size != bytes) {
      return fmt::format("shard '{}' has {} bytes, the index records {} (truncated)", path.string(), size, bytes);
    }
  }
  return std::nullopt;
}

void assign_region(const StateTensor& st, const at::Tensor& region) {
  at::NoGradGuard no_grad;
  at::Tensor local = st.tensor.detach();
  const bool padded = local.dim() > 0 && local.size(0) != st.local_shape[0];
  if (padded) local.zero_();  // padding rows stay zero
  at::Tensor dst = local;
  for (size_t d = 0; d < st.local_shape.size(); ++d) dst = dst.narrow(static_cast<int64_t>(d), 0, st.local_shape[d]);
  dst.copy_(region);
}

void load_safetensors(const SafetensorsFile& file, State& state) {
  for (auto& st : state.tensors) {
    if (group_of(st.key) != "model") continue;
    const std::string name = st.key.substr(6);
    const TensorEntry& entry = file.entry(name);
    TITAN_CHECK_VALUE(entry.shape == st.global_shape,
                      "[titan::checkpoint] expected '{}' of shape {}, got {} {} in "
                      "'{}'. The file is of another model or flavor.",
                      name, c10::str(at::IntArrayRef(st.global_shape)), entry.dtype,
                      c10::str(at::IntArrayRef(entry.shape)), file.path().string());
    const std::vector<int64_t> origin(entry.shape.size(), 0);
    assign_region(st, read_region(file, entry, origin, st.offset, st.local_shape, nullptr, name));
  }
}

nlohmann::json load(const fs::path& folder, State& state, const std::vector<std::string>& exclude) {
  if (const auto problem = check_complete(folder)) {
    TITAN_CHECK_VALUE(false,
                      "[titan::checkpoint::load] expected a complete checkpoint at '{}', got {}. Restore the "
                      "file or load another step (checkpoint.load_step).",
                      folder.string(), *problem);
  }
  const fs::path index_path = folder / "index.json";
  const Index index = IndexReader(index_path).read(read_json(index_path));
  std::map<std::string, SafetensorsFile> files;  // opened on first use
  std::vector<std::string> groups_held;
  for (const auto& [key, _] : index.tensors) groups_held.push_back(group_of(key));
  for (const auto& [group, _] : index.values.items()) groups_held.push_back(group);
  nlohmann::json skipped = nlohmann::json::array();
  at::NoGradGuard no_grad;
  for (auto& st : state.tensors) {
    if (excluded(st.key, exclude)) continue;
    if (std::find(groups_held.begin(), groups_held.end(), group_of(st.key)) == groups_held.end()) {
      if (std::find(skipped.begin(), skipped.end(), group_of(st.key)) == skipped.end())
        skipped.push_back(group_of(st.key));
      continue;
    }
    const auto saved_it = index.tensors.find(st.key);
    TITAN_CHECK_VALUE(saved_it != index.tensors.end(),
                      "[titan::checkpoint::load] expected tensor '{}' in '{}', got none. The "
                      "checkpoint is of another model, flavor or optimizer; exclude its group with "
                      "checkpoint.exclude_from_loading.",
                      st.key, folder.string());
    const TensorRecord& saved = saved_it->second;
    const std::vector<int64_t>& global = saved.global_shape;
    TITAN_CHECK_VALUE(global == st.global_shape,
                      "[titan::checkpoint::load] expected '{}' of global shape {}, got {} in "
                      "'{}'. The checkpoint is of another model or flavor.",
                      st.key, c10::str(at::IntArrayRef(st.global_shape)), c10::str(at::IntArrayRef(global)),
                      folder.string());
    // The local rectangle, assembled from every saved shard that overlaps it.
    at::Tensor local = st.tensor.detach();
    if (local.dim() > 0 && local.size(0) != st.local_shape[0]) local.zero_();  // padding rows stay zero
    for (size_t d = 0; d < st.local_shape.size(); ++d)
      local = local.narrow(static_cast<int64_t>(d), 0, st.local_shape[d]);
    int64_t covered = 0;
    for (const ShardRecord& shard : saved.shards) {
      std::vector<int64_t> lo(global.size()), extent(global.size());
      int64_t numel = 1;
      for (size_t d = 0; d < global.size(); ++d) {
        lo[d] = std::max(shard.offset[d], st.offset[d]);
        extent[d] =
            std::max<int64_t>(0, std::min(shard.offset[d] + shard.shape[d], st.offset[d] + st.local_shape[d]) - lo[d]);
        numel *= extent[d];
      }
      if (numel == 0) continue;
      auto it = files.find(shard.file);
      if (it == files.end()) {
        it = files
                 .emplace(shard.file,
                          SafetensorsFile(file_in(folder, shard.file, fmt::format("a shard of '{}'", st.key))))
                 .first;
      }
      // The index and the file's own header must agree on where the shard lies.
      const TensorEntry entry{.dtype = saved.dtype, .shape = shard.shape, .begin = shard.begin, .end = shard.end};
      const TensorEntry* stored = it->second.contains(st.key) ? &it->second.entry(st.key) : nullptr;
      TITAN_CHECK_VALUE(stored != nullptr && stored->dtype == entry.dtype && stored->shape == entry.shape &&
                            stored->begin == entry.begin && stored->end == entry.end,
                        "[titan::checkpoint::load] expected '{}' in '{}' as the index records it ({} {} at bytes [{}, "
                        "{})), got {}. The index and the file disagree (corrupt); load another checkpoint.",
                        st.key, it->second.path().string(), entry.dtype, c10::str(entry.shape), entry.begin, entry.end,
                        stored == nullptr ? std::string("no such tensor")
                                          : fmt::format("{} {} at bytes [{}, {})", stored->dtype,
                                                        c10::str(stored->shape), stored->begin, stored->end));
      at::Tensor part = read_region(it->second, entry, shard.offset, lo, extent, &shard.crc32, st.key);
      at::Tensor dst = local;
      for (size_t d = 0; d < global.size(); ++d) {
        dst = dst.narrow(static_cast<int64_t>(d), lo[d] - st.offset[d], extent[d]);
      }
      dst.copy_(part);
      covered += numel;
    }
    TITAN_CHECK_VALUE(covered == local.numel(),
                      "[titan::checkpoint::load] expected the shards of '{}' in '{}' to cover "
                      "its region at {} of shape {}, got {} of {} elements. The index is inconsistent.",
                      st.key, folder.string(), c10::str(at::IntArrayRef(st.offset)),
                      c10::str(at::IntArrayRef(st.local_shape)), covered, local.numel());
  }
  nlohmann::json values = nlohmann::json::object();
  for (const auto& [group, value] : index.values.items()) {
    if (std::find(exclude.begin(), exclude.end(), group) == exclude.end()) values[group] = value;
  }
  values["skipped"] = skipped;
  values["step"] = index.step;
  return values;
}

std::vector<std::pair<int64_t, fs::path>> list_steps(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  if (!fs::is_directory(root)) return out;
  static const std::regex step_re(R"(step-(\d{1,18}))");  // stoll cannot overflow
  for (const auto& e : fs::directory_iterator(root)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_directory() && std::regex_match(name, m, step_re)) out.emplace_back(std::stoll(m[1].str()), e.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace titan::checkpoint
