// SPDX-License-Identifier: BSD-3-Clause
// A model for inference from a checkpoint, as titan-generate and titan-eval load one: a titan checkpoint (a step
// folder, or the newest complete step under a checkpoint root; the architecture from model.name and model.flavor,
// the vocabulary from the weights) or a Hugging Face folder (its config.json's `architectures` picks the family),
// built on any mesh and filled shard by shard, with the checkpoint's tokenizer or the job's.
//
//   const titan::InferenceCheckpoint source = titan::resolve_inference_checkpoint(path, "titan-eval");
//   auto model = titan::build_inference_model(source, config, seq_len, device, "titan-eval");
//   const titan::Parallelized parallel = titan::parallelize(*model, mesh, plan);
//   titan::load_inference_weights(*model, source, mesh);
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string_view>

#include "titan/core/config.hpp"
#include "titan/core/tool_args.hpp"

namespace titan::data {
class Tokenizer;
}
namespace titan::dist {
class Mesh;
}
namespace titan::models {
class Decoder;
}

namespace titan {

class Parallelized;

/// Where the weights are.
struct InferenceCheckpoint {
  /// A titan step folder (index.json) or a Hugging Face folder (config.json).
  std::filesystem::path folder{};
  /// A Hugging Face folder.
  bool hf = false;
};

/// The tools' --checkpoint flag (for a ToolSpec): a titan step folder, its parent or a Hugging Face folder.
ToolFlag inference_checkpoint_flag();

/// --checkpoint's value, else the job's <job.dump_folder>/<checkpoint.folder>.
std::string inference_checkpoint_path(const ToolArgs& args);

/// The checkpoint `path` names: a Hugging Face folder, a titan step folder, or the newest complete step under a
/// titan checkpoint root. Errors start with `[tool]` and name --checkpoint and its default.
InferenceCheckpoint resolve_inference_checkpoint(const std::filesystem::path& path, std::string_view tool);

/// The model of `source` for `seq_len` positions on `device` (at::kMeta for its shapes only), parameters
/// unfilled: config.json's architecture for a Hugging Face folder; model.name and model.flavor with the
/// weights' vocabulary for a titan checkpoint, with the LoRA adapters its `lora` values describe when it is a LoRA
/// run's (an adapter-only one, without its base, is refused naming titan-convert's merge).
std::shared_ptr<models::Decoder> build_inference_model(const InferenceCheckpoint& source, JobConfig config,
                                                       int64_t seq_len, const c10::Device& device,
                                                       std::string_view tool);

/// Fills `model` (parallelized by `parallel`, or whole) from `source`, each rank reading its shards: the
/// parameters and the MoE expert biases (routing buffers), and logs what was loaded. Optimizer, LR schedule and
/// data loader states are not read.
void load_inference_weights(const models::Decoder& model, const Parallelized& parallel,
                            const InferenceCheckpoint& source, const dist::Mesh& mesh);

/// True when the checkpoint folder holds its own tokenizer (tokenizer.json).
bool has_own_tokenizer(const InferenceCheckpoint& source);

/// The checkpoint's tokenizer, else the job's (model.hf_assets_path, or trained as the trainer trains it): rank 0
/// first, so a tokenizer trained on first use is trained once. Every rank calls it.
std::shared_ptr<data::Tokenizer> inference_tokenizer(const InferenceCheckpoint& source, const JobConfig& config,
                                                     int64_t vocab_size, const dist::Mesh& mesh);

/// The local rank's GPU when there is one (LOCAL_RANK of the launch environment), else the CPU.
c10::Device inference_device();

/// The mesh of the launch environment with the degrees of parallelism.*, over comm.backend ("auto": NCCL for a
/// GPU, Gloo on CPUs); logs as its rank from now on. Collective: every rank calls it.
dist::Mesh inference_mesh(const JobConfig& config, const c10::Device& device);

}  // namespace titan
