// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/inference.hpp"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/data/tokenizer.hpp"
#include "titan/dist/launch_env.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/models/decoder.hpp"
#include "titan/models/job_args.hpp"
#include "titan/models/model_spec.hpp"
#include "titan/nn/lora.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/train/data_setup.hpp"
#include "titan/train/rank_model.hpp"

namespace titan {

namespace fs = std::filesystem;

InferenceCheckpoint resolve_inference_checkpoint(const fs::path& path, std::string_view tool) {
  TITAN_CHECK_VALUE(
      fs::is_directory(path),
      "[{}] expected --checkpoint (default: <job.dump_folder>/<checkpoint.folder>) to name a titan "
      "checkpoint folder (step-N or its parent) or a Hugging Face folder, got '{}', which is not a folder.",
      tool, path.string());
  if (fs::exists(path / "config.json")) return {path, true};
  if (fs::exists(path / "index.json")) return {path, false};
  for (const auto& [step, folder] : checkpoint::list_steps(path)) {
    if (!checkpoint::check_complete(folder)) return {folder, fs::exists(folder / "config.json")};
  }
  TITAN_CHECK_VALUE(false,
                    "[{}] expected --checkpoint '{}' to hold config.json (Hugging Face), index.json (a titan step "
                    "folder) or complete step-N folders, got none. Point it at <dump_folder>/checkpoint.",
                    tool, path.string());
  return {};
}

std::shared_ptr<models::Decoder> build_inference_model(const InferenceCheckpoint& source, JobConfig config,
                                                       int64_t seq_len, const c10::Device& device,
                                                       std::string_view tool) {
  if (source.hf) {
    const nlohmann::json hf = checkpoint::HfReader(source.folder).config();
    return models::model_spec_for_hf(hf).from_hf(hf, seq_len, device);
  }
  std::ifstream in(source.folder / "index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  const auto& tensors = index.at("tensors");
  const nlohmann::json lora = index.value("values", nlohmann::json::object()).value("lora", nlohmann::json());
  TITAN_CHECK_VALUE(tensors.contains("model.tok_embeddings.weight"),
                    "[{}] expected model.tok_embeddings.weight in '{}', got a checkpoint without it.{}", tool,
                    (source.folder / "index.json").string(),
                    lora.is_null() ? ""
                                   : " It holds LoRA adapters only (lora.save_adapter_only): fold them into their "
                                     "base first (titan-convert to-hf --input STEP --base BASE --output DIR) and "
                                     "pass --checkpoint DIR.");
  const int64_t vocab = tensors.at("model.tok_embeddings.weight").at("global_shape").at(0).get<int64_t>();
  config.training.seq_len = seq_len;
  auto model = models::build_model(config, vocab, {.device = device});
  if (!lora.is_null()) {
    // The adapters were trained beside this base: the model gets them back, shaped as the checkpoint says, so
    // load_inference_weights fills them and the forward is the trained one (without them it is the frozen base).
    const nn::LoraOptions options{.rank = lora.at("rank").get<int64_t>(),
                                  .alpha = lora.at("alpha").get<double>(),
                                  .dropout = lora.at("dropout").get<double>(),
                                  .target_modules = lora.at("target_modules").get<std::vector<std::string>>()};
    const nn::LoraConversion report = nn::add_lora(*model, options);
    log::info("[{}] lora: {} Linear layers carry the checkpoint's adapters (rank {}, alpha {})", tool,
              report.adapted.size(), options.rank, options.alpha);
  }
  return model;
}

ToolFlag inference_checkpoint_flag() {
  return {.name = "--checkpoint",
          .value = "PATH",
          .help =
              "a titan step folder, its parent (the newest step) or a Hugging Face folder (default: "
              "<job.dump_folder>/<checkpoint.folder>)"};
}

std::string inference_checkpoint_path(const ToolArgs& args) {
  const JobConfig& config = args.config;
  return args.value("--checkpoint").value_or((fs::path(config.job.dump_folder) / config.checkpoint.folder).string());
}

void load_inference_weights(const models::Decoder& model, const Parallelized& parallel,
                            const InferenceCheckpoint& source, const dist::Mesh& mesh) {
  const std::vector<at::Tensor> params = model.unique_parameters();
  checkpoint::State state;
  // A LoRA checkpoint keeps its adapters in a group of their own (lora.<fqn>) beside the frozen base (model.<fqn>).
  std::vector<std::string> base_names, adapter_names;
  std::vector<at::Tensor> base, adapters;
  const std::vector<std::string> names = parameter_names(model, params);
  for (size_t i = 0; i < params.size(); ++i) {
    const bool adapter = nn::is_lora_param(names[i]);
    (adapter ? adapter_names : base_names).push_back(names[i]);
    (adapter ? adapters : base).push_back(params[i]);
  }
  checkpoint::add_model(state, base_names, base, &mesh);
  if (!adapters.empty()) checkpoint::add_model(state, adapter_names, adapters, &mesh, "lora");
  // MoE expert biases steer routing: buffers, under "moe.<fqn>" in a titan checkpoint (as the trainer saves
  // them) and mapped by the adapter (DeepSeek-V3's e_score_correction_bias) from Hugging Face.
  checkpoint::add_expert_biases(state, model, source.hf ? "model" : "moe", &mesh);
  if (source.hf) {
    checkpoint::load_hf(source.folder, state, *model.hf_adapter());
  } else {
    checkpoint::load(source.folder, state, {"optimizer", "lr_scheduler", "dataloader", "train_state"});
  }
  log::info("Loaded {} ({} parameters, {}) from {} {}", model.shape().where, model.num_params(), parallel.describe(),
            source.hf ? "the Hugging Face folder" : "the titan checkpoint", source.folder.string());
}

bool has_own_tokenizer(const InferenceCheckpoint& source) { return fs::exists(source.folder / "tokenizer.json"); }

std::shared_ptr<data::Tokenizer> inference_tokenizer(const InferenceCheckpoint& source, const JobConfig& config,
                                                     int64_t vocab_size, const dist::Mesh& mesh) {
  if (has_own_tokenizer(source)) return data::load_tokenizer(source.folder);
  std::shared_ptr<data::Tokenizer> tokenizer;
  if (mesh.rank() == 0) tokenizer = build_tokenizer(config, vocab_size);
  mesh.group("world").barrier();
  if (mesh.rank() != 0) tokenizer = build_tokenizer(config, vocab_size);
  return tokenizer;
}

c10::Device inference_device() {
  if (!at::hasCUDA()) return c10::Device(c10::kCPU);
  const int64_t local_rank = dist::read_launch_env().local_rank;
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % at::getNumGPUs()));
}

dist::Mesh inference_mesh(const JobConfig& config, const c10::Device& device) {
  const std::string backend = config.comm.backend != "auto" ? config.comm.backend : device.is_cuda() ? "nccl" : "gloo";
  dist::Mesh mesh = dist::Mesh::from_launch_env(config.parallelism, {.backend = backend});
  log::set_rank(static_cast<int>(mesh.rank()));
  return mesh;
}

}  // namespace titan
