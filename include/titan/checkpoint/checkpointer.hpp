// SPDX-License-Identifier: BSD-3-Clause
// Checkpointer: torchtitan's checkpoint policy over titan's sharded format. Saves every `interval`
// steps (and at the last step, model-only in export_dtype or HF format when asked), keeps the
// newest keep_latest_k (older ones deleted on a background thread), loads load_step or the newest
// complete checkpoint (a broken newest one is skipped with a warning), else initial_load_path
// (titan checkpoint folder, a .safetensors file, or an HF folder). Async save copies the state to
// host memory at the step boundary and writes it on a background thread; the next save (or the
// end of training) waits for it, training does not.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/core/config.hpp"

namespace titan::checkpoint {

class HfAdapter;

class Checkpointer {
 public:
  /// Checkpoints live under dump_folder / config.folder. `hf` (optional) enables HF import/export; the HF export
  /// carries the tokenizer of `hf_tokenizer` (the run's model.hf_assets_path; save_hf). Collective over the mesh
  /// (agrees on nothing but is constructed on every rank).
  Checkpointer(CheckpointConfig config, std::filesystem::path dump_folder, const dist::Mesh& mesh,
               std::shared_ptr<const HfAdapter> hf = nullptr, double commit_timeout_s = 600.0,
               std::filesystem::path hf_tokenizer = {});
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  /// Loads into state per the policy and returns the loaded values plus "step" (the checkpoint's
  /// step; 0 for initial weights), or nullopt when there was nothing to load.
  std::optional<nlohmann::json> load(State& state);
  /// Whether `step` is a save step of a run ending at last_step.
  bool due(int64_t step, int64_t last_step) const;
  /// Saves state as step-<step> (the last save: model only / HF per the config). Waits for the
  /// previous async save first; returns once the state is staged (async) or written (sync).
  void save(int64_t step, const State& state, bool last);
  /// Waits for the in-flight save and purge; rethrows a background error.
  void wait();
  /// dump_folder / folder
  const std::filesystem::path& root() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan::checkpoint
