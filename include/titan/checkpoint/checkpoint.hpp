// SPDX-License-Identifier: BSD-3-Clause
// titan's sharded checkpoint: every rank writes the shards it owns (one safetensors file per rank)
// and rank 0 an index (index.json: each tensor's global shape, dtype, placements and shards, each
// shard's file, offset in the global tensor, byte range and chunk checksums), under
// <folder>/step-N/. The folder is written under a temporary name and renamed once the index is
// complete, so a folder named step-N is always whole. Any checkpoint loads onto any mesh: each
// rank reads, for each of its (rectangular) regions, only the byte spans of the saved shards that
// overlap it, verified by their checksums.
//
// Example (a custom loop; the Trainer does this through Checkpointer):
//   checkpoint::State state;
//   checkpoint::add_model(state, names, params, mesh);
//   checkpoint::add_optimizer(state, names, optimizer, mesh);
//   checkpoint::save(dir / "step-20", state, mesh);
//   ... later, on any mesh:
//   checkpoint::load(dir / "step-20", state);  // fills every tensor in place, returns the values
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "titan/layout/sharded_param.hpp"

namespace titan {
class Optimizer;
}
namespace torch::nn {
class Module;
}

namespace titan::dist {
class Mesh;
}

namespace titan::checkpoint {

/// One tensor of a training state: whole, or this rank's rectangle of a global tensor (its layout).
struct StateTensor : parallel::TensorLayout {
  std::string key;      ///< "model.<fqn>", "optimizer.<fqn>.exp_avg", "train_state.rng"
  at::Tensor tensor{};  ///< the local tensor (dim 0 may be padded past local_shape)
  bool owner = true;    ///< this rank writes it (false on every other replica)
};

/// What a checkpoint holds: tensors and JSON values, grouped by the key's first segment (model,
/// optimizer, lr_scheduler, dataloader, train_state), the unit of exclude_from_loading.
struct State {
  std::vector<StateTensor> tensors{};
  nlohmann::json values = nlohmann::json::object();  ///< group -> JSON (lr_scheduler, dataloader, train_state)
};

/// The whole tensor or this rank's shard of p, keyed `key`. On a mesh, replicas of a region are
/// written once (by the rank at coordinate 0 of every axis the tensor is not sharded on). A
/// `per_stage` tensor (a parameter or its optimizer state) exists on its pipeline stage's ranks
/// only, so the pp axis holds no replicas of it.
StateTensor state_tensor(std::string key, const at::Tensor& p, const dist::Mesh* mesh, bool per_stage = false);
/// Adds "<group>.<name>" for each parameter: group "model", or "lora" for LoRA adapters (nn/lora.hpp).
void add_model(State& state, const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
               const dist::Mesh* mesh, const std::string& group = "model");
/// Whether a key's group holds model weights: "model", or "lora" (a LoRA run's adapters).
bool is_model_group(const std::string& key);
/// Adds "<group>.<fqn>" for each MoE expert bias of model (a buffer named *.expert_bias: it steers routing): group
/// "moe" as the trainer saves them in a titan checkpoint, "model" for a Hugging Face folder, whose adapter names them
/// (DeepSeek-V3's e_score_correction_bias).
void add_expert_biases(State& state, const torch::nn::Module& model, const std::string& group, const dist::Mesh* mesh);
/// Adds "optimizer.<name>.<state>" for each of the optimizer's parameters and each of its named state
/// tensors (AdamW: exp_avg, exp_avg_sq, step), through the optim::Optimizer interface only.
void add_optimizer(State& state, const std::vector<std::string>& names, const Optimizer& optimizer,
                   const dist::Mesh* mesh);

/// Whether an index may name this file: a plain name inside the checkpoint folder (not empty, not "." or
/// "..", no separator or NUL). An index is untrusted input; everything else is refused as corrupt.
bool is_plain_file_name(const std::string& name);

/// The group of a key: its first dot-separated segment ("model.norm.weight" -> "model").
std::string group_of(const std::string& key);

/// A host copy of what this rank writes (owned tensors only, padding dropped, model tensors cast to
/// model_dtype): afterwards training may change the originals while the copy is written. `reuse`,
/// a previous stage() result no longer being written, lends its buffers where they fit.
State stage(const State& state, at::ScalarType model_dtype, const State* reuse = nullptr);

/// Writes this rank's part of a staged state into `tmp_folder` (rank-R.safetensors + rank-R.json).
void write_rank_part(const std::filesystem::path& tmp_folder, int64_t rank, const State& staged);
/// Rank 0: waits (up to timeout_s) until all world_size parts are in tmp_folder, writes the index and
/// renames tmp_folder to folder. Returns false (leaving tmp_folder) when a part never came or
/// *cancel became true while waiting.
bool commit(const std::filesystem::path& tmp_folder, const std::filesystem::path& folder, int64_t world_size,
            int64_t step, double timeout_s, const std::atomic<bool>* cancel = nullptr);

/// Saves state to folder synchronously (collective over the mesh's world).
void save(const std::filesystem::path& folder, const State& state, const dist::Mesh& mesh, int64_t step = 0,
          at::ScalarType model_dtype = at::kFloat);

/// Why a checkpoint folder cannot be loaded, or nullopt if its index and every file it lists are
/// present with the recorded sizes.
std::optional<std::string> check_complete(const std::filesystem::path& folder);

/// Loads folder into state's tensors in place (each rank reading only what overlaps its regions) and
/// returns the values; groups in `exclude` are skipped. A group the checkpoint does not hold (e.g.
/// optimizer in a model-only save) is skipped and reported in the returned "skipped" list.
nlohmann::json load(const std::filesystem::path& folder, State& state, const std::vector<std::string>& exclude = {});

class SafetensorsFile;
/// Loads the "model." tensors of state from one safetensors file keyed by FQN (the seed checkpoint,
/// titan-convert's output), each rank reading only its regions' bytes.
void load_safetensors(const SafetensorsFile& file, State& state);
/// Copies the values of st's local rectangle into its tensor (dim-0 padding zeroed).
void assign_region(const StateTensor& st, const at::Tensor& region);

/// The step-N folders under root, newest first (complete or not: see check_complete).
std::vector<std::pair<int64_t, std::filesystem::path>> list_steps(const std::filesystem::path& root);

}  // namespace titan::checkpoint
