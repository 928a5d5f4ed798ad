// SPDX-License-Identifier: BSD-3-Clause
#include "titan/checkpoint/hf.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <map>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/data/tokenizer.hpp"

namespace titan::checkpoint {
namespace fs = std::filesystem;

std::vector<std::pair<std::string, at::Tensor>> HfAdapter::to_hf_tensors(const std::string& fqn,
                                                                         const at::Tensor& whole) const {
  return {{hf_name(fqn), to_hf(fqn, whole)}};
}

at::Tensor HfAdapter::read_hf(const std::string& fqn, const HfReader& reader) const {
  std::string name = hf_name(fqn);
  if (!reader.contains(name) && !hf_fallback(fqn).empty()) name = hf_fallback(fqn);
  return from_hf(fqn, reader.read(name));
}

at::Tensor HfAdapter::join_hf(const std::string& hf_name,
                              const std::vector<std::pair<std::string, at::Tensor>>& pieces) const {
  std::vector<std::string> fqns;
  for (const auto& piece : pieces) fqns.push_back(piece.first);
  TITAN_CHECK_VALUE(false,
                    "[titan::checkpoint::save_hf] expected one titan tensor per Hugging Face tensor, got {} for '{}'. "
                    "Override HfAdapter::join_hf to combine them.",
                    fmt::join(fqns, ", "), hf_name);
  return {};
}

namespace {
// (heads * rows, rest...) viewed as (heads, a, b, rest...), a and b swapped, flattened back.
at::Tensor swap_within_heads(const at::Tensor& w, int64_t heads, int64_t a, int64_t b) {
  std::vector<int64_t> shape{heads, a, b};
  for (int64_t d = 1; d < w.dim(); ++d) shape.push_back(w.size(d));
  return w.reshape(shape).transpose(1, 2).reshape(w.sizes());
}
}  // namespace

void write_tokenizer_files(const fs::path& from, const fs::path& tmp, const fs::path& folder) {
  const fs::path dir = fs::is_regular_file(from) ? from.parent_path() : from;
  if (!fs::exists(dir / "tokenizer.json") && !fs::exists(dir / "tokenizer.model")) {
    log::warn(
        "[titan::checkpoint::save_hf] the Hugging Face folder {} carries no tokenizer: model.hf_assets_path '{}' "
        "holds no tokenizer.json or tokenizer.model. A run without one trains a byte-level BPE and caches it under "
        "$TITAN_CACHE_DIR/tokenizers (default ~/.cache/titan/tokenizers); give that folder, or the HF tokenizer the "
        "run used, as --model.hf_assets_path, or copy its files beside config.json.",
        folder.string(), from.string());
    return;
  }
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                           "generation_config.json"}) {
    if (fs::exists(dir / name)) fs::copy_file(dir / name, tmp / name, fs::copy_options::overwrite_existing);
  }
  if (fs::exists(dir / "generation_config.json")) return;
  // What generate() stops on and starts from; transformers reads them here, not from the tokenizer.
  const auto loaded = data::load_tokenizer(dir);
  nlohmann::json generation = nlohmann::json::object();
  if (const auto bos = loaded->bos_id()) generation["bos_token_id"] = *bos;
  if (const auto eos = loaded->eos_id()) generation["eos_token_id"] = *eos;
  if (!generation.empty()) write_file_atomically(tmp / "generation_config.json", generation.dump(2));
}

std::string hf_outer_name(const std::string& fqn) {
  if (fqn == "tok_embeddings.weight") return "model.embed_tokens.weight";
  if (fqn == "norm.weight") return "model.norm.weight";
  if (fqn == "output.weight") return "lm_head.weight";
  return {};
}

const char* hf_dtype_name(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32";
}

at::Tensor rope_rows_to_hf(const at::Tensor& w, int64_t heads) {
  // Per head, row (pair i, member j) -> (member j, pair i).
  return swap_within_heads(w, heads, w.size(0) / heads / 2, 2);
}

at::Tensor rope_rows_from_hf(const at::Tensor& w, int64_t heads) {
  return swap_within_heads(w, heads, 2, w.size(0) / heads / 2);
}

void save_hf(const fs::path& folder, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
             const HfAdapter& adapter, at::ScalarType dtype, int64_t max_shard_bytes, const fs::path& tokenizer) {
  // Every HF tensor's pieces (fqn, tensor), in the order first named: usually one each.
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, at::Tensor>>>> pieces;
  std::map<std::string, size_t> slot;
  for (const auto& [fqn, t] : tensors) {
    for (auto& [name, converted] : adapter.to_hf_tensors(fqn, t.detach().to(at::kCPU))) {
      const auto [it, fresh] = slot.emplace(name, pieces.size());
      if (fresh) pieces.emplace_back(name, std::vector<std::pair<std::string, at::Tensor>>{});
      pieces[it->second].second.emplace_back(fqn, std::move(converted));
    }
  }
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  int64_t shard_bytes = 0, total = 0;
  for (auto& [name, parts] : pieces) {
    const at::Tensor joined = parts.size() == 1 ? parts[0].second : adapter.join_hf(name, parts);
    parts.clear();  // the pieces go as soon as their HF tensor exists
    at::Tensor hf = joined.to(dtype).contiguous();
    const auto bytes = static_cast<int64_t>(hf.nbytes());
    if (shard_bytes > 0 && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace_back(name, std::move(hf));
    shard_bytes += bytes;
    total += bytes;
  }
  write_folder_atomically(folder, [&](const fs::path& tmp) {
    const std::map<std::string, std::string> metadata{{"format", "pt"}};
    if (shards.size() == 1) {
      write_safetensors(tmp / "model.safetensors", shards[0], metadata);
    } else {
      nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", nlohmann::json::object()}};
      for (size_t i = 0; i < shards.size(); ++i) {
        const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
        write_safetensors(tmp / name, shards[i], metadata);
        for (const auto& [key, _] : shards[i]) index["weight_map"][key] = name;
      }
      write_file_atomically(tmp / "model.safetensors.index.json", index.dump(2));
    }
    write_file_atomically(tmp / "config.json", adapter.hf_config(dtype).dump(2));
    if (!tokenizer.empty()) write_tokenizer_files(tokenizer, tmp, folder);
  });
}

void write_folder_atomically(const fs::path& folder, const std::function<void(const fs::path& tmp)>& fill) {
  const fs::path tmp = folder.parent_path() / fmt::format(".{}.tmp", folder.filename().string());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  fill(tmp);
  if (fs::exists(folder)) fs::remove_all(folder);
  fs::rename(tmp, folder);
}

HfReader::HfReader(const fs::path& folder) : folder_(folder) {
  const fs::path config_path = folder / "config.json";
  std::ifstream config(config_path);
  TITAN_CHECK_VALUE(config.good(),
                    "[titan::checkpoint::HfReader] expected a Hugging Face folder with config.json, got "
                    "none at '{}'.",
                    config_path.string());
  config_ = nlohmann::json::parse(config, nullptr, /*allow_exceptions=*/false);
  TITAN_CHECK_VALUE(config_.is_object(), "[titan::checkpoint::HfReader] expected a JSON object in '{}', got {}.",
                    config_path.string(), config_.is_discarded() ? "unparsable text" : config_.type_name());
  const fs::path index_path = folder / "model.safetensors.index.json";
  std::map<std::string, std::shared_ptr<SafetensorsFile>> opened;
  auto open = [&](const std::string& name) {
    auto& f = opened[name];
    if (!f) f = std::make_shared<SafetensorsFile>(folder / name);
    return f;
  };
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    const auto index = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    const auto weight_map = index.is_object() ? index.find("weight_map") : index.end();
    TITAN_CHECK_VALUE(weight_map != index.end() && weight_map->is_object(),
                      "[titan::checkpoint::HfReader] expected a JSON object with a \"weight_map\" object in '{}', "
                      "got {}. The file is corrupt.",
                      index_path.string(), index.is_discarded() ? "unparsable text" : "none");
    for (const auto& [key, file] : weight_map->items()) {
      // An index is untrusted input: it may name only files inside the folder.
      const std::string name = file.is_string() ? file.get<std::string>() : std::string();
      TITAN_CHECK_VALUE(file.is_string() && is_plain_file_name(name),
                        "[titan::checkpoint::HfReader] expected weight_map[\"{}\"] of '{}' to name a file inside the "
                        "folder, got {}. The index is corrupt or hostile; refusing to read it.",
                        key, index_path.string(), file.dump());
      file_of_[key] = open(name);
    }
  } else {
    TITAN_CHECK_VALUE(fs::exists(folder / "model.safetensors"),
                      "[titan::checkpoint::HfReader] expected "
                      "model.safetensors or model.safetensors.index.json in '{}', got neither.",
                      folder.string());
    const auto file = open("model.safetensors");
    for (const auto& [key, _] : file->entries()) file_of_[key] = file;
  }
}

HfReader::~HfReader() = default;

std::vector<std::string> HfReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : file_of_) out.push_back(name);
  return out;
}

at::Tensor HfReader::read(const std::string& hf_name) const {
  const auto it = file_of_.find(hf_name);
  TITAN_CHECK_VALUE(it != file_of_.end(),
                    "[titan::checkpoint::HfReader] expected tensor '{}' in the Hugging Face "
                    "folder '{}', got none. The folder holds another model.",
                    hf_name, folder_.string());
  return it->second->read(hf_name);
}

void load_hf(const fs::path& folder, State& state, const HfAdapter& adapter) {
  const HfReader reader(folder);
  for (auto& st : state.tensors) {
    if (group_of(st.key) != "model") continue;
    const std::string fqn = st.key.substr(6);
    at::Tensor whole = adapter.read_hf(fqn, reader);
    TITAN_CHECK_VALUE(whole.sizes().vec() == st.global_shape,
                      "[titan::checkpoint::load_hf] expected '{}' ({}) of shape "
                      "{}, got {} in '{}'. The folder holds another model size.",
                      adapter.hf_name(fqn), fqn, c10::str(at::IntArrayRef(st.global_shape)), c10::str(whole.sizes()),
                      folder.string());
    for (size_t d = 0; d < st.local_shape.size(); ++d) {
      whole = whole.narrow(static_cast<int64_t>(d), st.offset[d], st.local_shape[d]);
    }
    assign_region(st, whole);
  }
}

}  // namespace titan::checkpoint
