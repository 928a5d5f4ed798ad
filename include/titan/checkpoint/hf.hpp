// SPDX-License-Identifier: BSD-3-Clause
// Hugging Face weights: a folder with config.json and model.safetensors, or shards listed by
// model.safetensors.index.json. A model's HfAdapter maps its FQNs and layouts to HF's (Llama 3:
// names plus the q/k row permutation between interleaved and rotate-half RoPE).
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace titan::checkpoint {

struct State;
class SafetensorsFile;
class HfReader;

/// How one model's parameters map to a Hugging Face checkpoint.
class HfAdapter {
 public:
  virtual ~HfAdapter() = default;
  /// The HF key of a titan FQN (tok_embeddings.weight -> model.embed_tokens.weight).
  virtual std::string hf_name(const std::string& fqn) const = 0;
  /// Another HF key holding fqn when hf_name is absent (a tied lm_head read from the embedding), or "".
  virtual std::string hf_fallback(const std::string& fqn) const { return {}; }
  /// The whole titan tensor in HF layout, and back.
  virtual at::Tensor to_hf(const std::string& fqn, const at::Tensor& whole) const = 0;
  virtual at::Tensor from_hf(const std::string& fqn, const at::Tensor& whole) const = 0;
  /// config.json for weights stored as dtype.
  virtual nlohmann::json hf_config(at::ScalarType dtype) const = 0;
  /// The HF tensors of one whole titan tensor, (HF key, tensor): by default one, hf_name(fqn) holding
  /// to_hf(fqn, whole). A titan tensor that stacks several HF ones (MoE experts) splits here.
  virtual std::vector<std::pair<std::string, at::Tensor>> to_hf_tensors(const std::string& fqn,
                                                                        const at::Tensor& whole) const;
  /// The whole titan tensor fqn from an HF folder: by default hf_name(fqn) (else hf_fallback(fqn)) read
  /// and passed through from_hf. A titan tensor that stacks several HF ones reads and stacks them here.
  virtual at::Tensor read_hf(const std::string& fqn, const HfReader& reader) const;
  /// One HF tensor from the pieces several titan tensors gave under its key in to_hf_tensors, each with
  /// its fqn, in the order saved (gpt-oss's gate_up_proj interleaves the gate and up projections). By
  /// default an error: a titan tensor maps to HF tensors of its own.
  virtual at::Tensor join_hf(const std::string& hf_name,
                             const std::vector<std::pair<std::string, at::Tensor>>& pieces) const;
};

/// The HF key of what every decoder family names alike: the embedding, the final norm and the head
/// (tok_embeddings.weight -> model.embed_tokens.weight); "" for any other FQN.
std::string hf_outer_name(const std::string& fqn);

/// config.json's name of `dtype`: "bfloat16", "float16", else "float32".
const char* hf_dtype_name(at::ScalarType dtype);

/// q/k projection rows of `heads` heads from titan's RoPE layout (adjacent pairs (x[2i], x[2i+1]), as
/// torchtitan's Llama) to HF's (halves (x[i], x[i + hd/2])): w (heads * HD, ...), or a per-head norm
/// weight (HD) with heads = 1. rope_rows_from_hf is the inverse.
at::Tensor rope_rows_to_hf(const at::Tensor& w, int64_t heads);
at::Tensor rope_rows_from_hf(const at::Tensor& w, int64_t heads);

/// Bytes per safetensors shard of an HF folder save_hf writes, by default (transformers' 5 GB, in GiB).
inline constexpr int64_t kHfMaxShardBytes = int64_t{5} << 30;

/// Writes whole titan tensors (fqn, tensor) as an HF folder: config.json, and model.safetensors or,
/// past max_shard_bytes, model-0000i-of-0000n.safetensors + model.safetensors.index.json. With `tokenizer` (the
/// run's model.hf_assets_path: a folder, or its tokenizer.json) the folder carries that tokenizer: those of
/// tokenizer.json, tokenizer_config.json, special_tokens_map.json and tokenizer.model it holds, and
/// generation_config.json (its own, else the tokenizer's BOS and EOS ids), so AutoTokenizer.from_pretrained and
/// pipelines load the export alone. A `tokenizer` holding no tokenizer.json or tokenizer.model (a run that trained
/// its own BPE) is named in a warning and left out. The folder is written under a temporary name and renamed when
/// complete.
void save_hf(const std::filesystem::path& folder, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
             const HfAdapter& adapter, at::ScalarType dtype, int64_t max_shard_bytes = kHfMaxShardBytes,
             const std::filesystem::path& tokenizer = {});

/// Writes a folder whole or not at all: `fill` writes its files into a temporary sibling, renamed to `folder` (which
/// it replaces) once fill returns.
void write_folder_atomically(const std::filesystem::path& folder,
                             const std::function<void(const std::filesystem::path& tmp)>& fill);

/// The tokenizer files of `from` (a folder, or its tokenizer.json) written into `tmp`, the temporary folder of an
/// export to `folder`, as save_hf describes; a `from` without tokenizer.json or tokenizer.model is named in a
/// warning and nothing is written. PEFT adapter folders carry them the same way.
void write_tokenizer_files(const std::filesystem::path& from, const std::filesystem::path& tmp,
                           const std::filesystem::path& folder);

/// An HF folder opened for reading (single or sharded safetensors).
class HfReader {
 public:
  explicit HfReader(const std::filesystem::path& folder);
  ~HfReader();
  bool contains(const std::string& hf_name) const { return file_of_.count(hf_name) != 0; }
  /// Every tensor name in the folder.
  std::vector<std::string> names() const;
  /// The whole tensor as stored; throws naming the folder when absent.
  at::Tensor read(const std::string& hf_name) const;
  /// config.json
  const nlohmann::json& config() const { return config_; }

 private:
  std::filesystem::path folder_;
  nlohmann::json config_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> file_of_;
};

/// Loads the "model." tensors of state from an HF folder. The q/k permutation mixes rows, so each
/// rank reads whole tensors and keeps its region (an import is one-off; titan checkpoints read only
/// the overlapping bytes).
void load_hf(const std::filesystem::path& folder, State& state, const HfAdapter& adapter);

}  // namespace titan::checkpoint
