// SPDX-License-Identifier: BSD-3-Clause
// titan-generate: text from a checkpoint of any registered model (models/model_spec.hpp: Llama 3, Qwen3,
// Qwen3-MoE, DeepSeek-V3, ...), with a KV cache (docs/generation.md).
//   titan-generate [--checkpoint PATH] --prompt TEXT [--prompt TEXT ...] [--max-new-tokens N]
//                  [--greedy | --temperature T --top-k K --top-p P] [--eos-id ID] [--no-bos]
//                  [--output text|jsonl] [--prompt-ids 1,2,3]
//                  [config keys: --job.config_file FILE, --model.flavor NAME, --debug.seed S, ...]
//     PATH: a titan checkpoint (<dump>/checkpoint/step-N, or <dump>/checkpoint for its newest step;
//     the architecture comes from model.name and model.flavor, the vocabulary size from the weights) or a
//     Hugging Face folder (config.json + safetensors; its `architectures` picks the family); default: the
//     job's <job.dump_folder>/<checkpoint.folder>. Prompts of different lengths are one batch.
//   titan-run --nproc-per-node 2 titan-generate ... --parallelism.tensor_parallel_degree 2   splits every
//   layer over 2 ranks.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/tool_args.hpp"
#include "titan/data/tokenizer.hpp"
#include "titan/dist/launch_env.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/models/decoder.hpp"
#include "titan/models/job_args.hpp"
#include "titan/models/model_spec.hpp"
#include "titan/nn/generate.hpp"
#include "titan/nn/kv_cache.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/data_setup.hpp"
#include "titan/train/trainer.hpp"

namespace fs = std::filesystem;
using namespace titan;

namespace {

const ToolSpec kSpec = {
    .name = "titan-generate",
    .usage =
        "usage: titan-generate [--checkpoint PATH] --prompt TEXT [--prompt TEXT ...] [--max-new-tokens N]\n"
        "                      [--greedy | --temperature T --top-k K --top-p P] [--eos-id ID] [--no-bos]\n"
        "                      [--output text|jsonl] [--prompt-ids 1,2,3] [config keys: --job.config_file FILE,\n"
        "                      --model.flavor NAME, --debug.seed S, --parallelism.tensor_parallel_degree N, ...]\n",
    .flags = {{.name = "--checkpoint",
               .value = "PATH",
               .help = "a titan step folder, its parent (the newest step) or a Hugging Face folder (default: "
                       "<job.dump_folder>/<checkpoint.folder>)"},
              {.name = "--prompt", .value = "TEXT", .help = "a prompt, one batch row each (repeat the flag)"},
              {.name = "--prompt-ids", .value = "1,2,3", .help = "a prompt given as token ids (after the text ones)"},
              {.name = "--max-new-tokens", .value = "N", .help = "most tokens generated per prompt (default 64)"},
              {.name = "--greedy", .help = "take the most likely token (the default; temperature 0)"},
              {.name = "--temperature", .value = "T", .help = "sample at this temperature (0: greedy)"},
              {.name = "--top-k", .value = "K", .help = "sample among the K most likely tokens (0: all)"},
              {.name = "--top-p", .value = "P", .help = "sample among the most likely tokens holding P of the mass"},
              {.name = "--eos-id",
               .value = "ID",
               .help = "the token that ends a sequence (-1: none; default: the tokenizer's)"},
              {.name = "--no-bos", .help = "do not prepend the tokenizer's BOS to text prompts"},
              {.name = "--output",
               .value = "text|jsonl",
               .help = "the prompt and its continuation, or one JSON object a prompt"}},
    .renamed = {{.flag = "--tp", .instead = "--parallelism.tensor_parallel_degree N"},
                {.flag = "--seed", .instead = "--debug.seed S"},
                {.flag = "--tokenizer", .instead = "--model.hf_assets_path PATH"}},
    .keys =
        "model.name, model.flavor, model.hf_assets_path (the tokenizer when the checkpoint has none), "
        "debug.seed (sampling), parallelism.tensor_parallel_degree, job.dump_folder and checkpoint.folder "
        "(the default checkpoint), training.dataset* (a tokenizer trained as the trainer trains it)"};

struct Options {
  /// Titan checkpoint (step folder or its parent) or Hugging Face folder.
  std::string checkpoint{};
  /// Text prompts, one batch row each.
  std::vector<std::string> prompts{};
  /// Prompts given as token ids (after the text prompts).
  std::vector<std::vector<int64_t>> prompt_ids{};
  /// Prepend the tokenizer's BOS to text prompts (as the data pipeline does in training).
  bool add_bos = true;
  /// EOS id override (-1: none); default: the tokenizer's.
  std::optional<int64_t> eos_id{};
  /// text: the prompt and its continuation; jsonl: one JSON object per prompt with the ids.
  std::string output = "text";
  /// Tokens, sampling and seed.
  nn::GenerateConfig generate{};
};

std::vector<int64_t> id_list(const std::string& text) {
  std::vector<int64_t> ids;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string id = text.substr(begin, end - begin);
    size_t used = 0;
    try {
      ids.push_back(std::stoll(id, &used));
    } catch (const std::exception&) {
      used = 0;
    }
    TITAN_CHECK_VALUE(!id.empty() && used == id.size(),
                      "[titan-generate] expected --prompt-ids as whole numbers joined by commas, got '{}'.", text);
    begin = end + 1;
  }
  return ids;
}

Options options_of(const ToolArgs& args) {
  const JobConfig& config = args.config;
  Options o;
  o.checkpoint =
      args.value("--checkpoint").value_or((fs::path(config.job.dump_folder) / config.checkpoint.folder).string());
  o.prompts = args.values("--prompt");
  for (const std::string& ids : args.values("--prompt-ids")) o.prompt_ids.push_back(id_list(ids));
  o.generate.max_new_tokens = args.integer("--max-new-tokens", o.generate.max_new_tokens);
  // A negative or zero count would reach the model as a sequence length and be blamed on training.seq_len.
  TITAN_CHECK_VALUE(o.generate.max_new_tokens >= 1, "[titan-generate] expected --max-new-tokens >= 1, got {}.",
                    o.generate.max_new_tokens);
  o.generate.sampling.temperature = args.number("--temperature", o.generate.sampling.temperature);
  // --greedy wins over a temperature wherever it sits on the line.
  if (args.has("--greedy")) o.generate.sampling.temperature = 0.0;
  o.generate.sampling.top_k = args.integer("--top-k", o.generate.sampling.top_k);
  o.generate.sampling.top_p = args.number("--top-p", o.generate.sampling.top_p);
  o.generate.seed = static_cast<uint64_t>(config.debug.seed.value_or(0));
  if (args.has("--eos-id")) o.eos_id = args.integer("--eos-id", -1);
  o.add_bos = !args.has("--no-bos");
  o.output = args.value("--output").value_or("text");
  TITAN_CHECK_VALUE(o.output == "text" || o.output == "jsonl",
                    "[titan-generate] expected --output text|jsonl, got '{}'.", o.output);
  TITAN_CHECK_VALUE(!o.prompts.empty() || !o.prompt_ids.empty(),
                    "[titan-generate] expected at least one --prompt TEXT or --prompt-ids 1,2,3, got none.");
  o.generate.sampling.validate();
  return o;
}

// The checkpoint to read: a Hugging Face folder, a titan step folder, or the newest complete step
// under a titan checkpoint root.
struct Source {
  fs::path folder{};
  bool hf = false;
};

Source resolve(const fs::path& path) {
  TITAN_CHECK_VALUE(fs::is_directory(path),
                    "[titan-generate] expected --checkpoint (default: <job.dump_folder>/<checkpoint.folder>) to name a "
                    "titan checkpoint folder (step-N or its parent) or a Hugging Face folder, got '{}', which is not a "
                    "folder.",
                    path.string());
  if (fs::exists(path / "config.json")) return {path, true};
  if (fs::exists(path / "index.json")) return {path, false};
  for (const auto& [step, folder] : checkpoint::list_steps(path)) {
    if (!checkpoint::check_complete(folder)) return {folder, fs::exists(folder / "config.json")};
  }
  TITAN_CHECK_VALUE(
      false,
      "[titan-generate] expected --checkpoint '{}' to hold config.json (Hugging Face), index.json (a titan "
      "step folder) or complete step-N folders, got none. Point it at <dump_folder>/checkpoint.",
      path.string());
  return {};
}

// The model for seq_len positions on device: the architecture of config.json (its `architectures` picks
// the family) for an HF folder; model.name and model.flavor with the weights' vocabulary for a titan checkpoint.
std::shared_ptr<models::Decoder> build_model(const Source& source, JobConfig config, int64_t seq_len,
                                             const at::Device& device) {
  if (source.hf) {
    const nlohmann::json hf = checkpoint::HfReader(source.folder).config();
    return models::model_spec_for_hf(hf).from_hf(hf, seq_len, device);
  }
  std::ifstream in(source.folder / "index.json");
  const auto tensors = nlohmann::json::parse(in).at("tensors");
  TITAN_CHECK_VALUE(tensors.contains("model.tok_embeddings.weight"),
                    "[titan-generate] expected model.tok_embeddings.weight in '{}', got a checkpoint without it.",
                    (source.folder / "index.json").string());
  const int64_t vocab = tensors.at("model.tok_embeddings.weight").at("global_shape").at(0).get<int64_t>();
  config.training.seq_len = seq_len;
  return models::build_model(config, vocab, {.device = device});
}

std::shared_ptr<data::Tokenizer> tokenizer_of(const Options& o, const Source& source, const JobConfig& config,
                                              int64_t vocab_size, const dist::Mesh& mesh) {
  // The checkpoint's own tokenizer, else the job's: model.hf_assets_path, or trained as the trainer trains it.
  if (fs::exists(source.folder / "tokenizer.json")) return data::load_tokenizer(source.folder);
  if (o.prompts.empty()) return nullptr;  // ids only
  // The job's tokenizer: rank 0 first, so a tokenizer trained on first use is trained once.
  std::shared_ptr<data::Tokenizer> tokenizer;
  if (mesh.rank() == 0) tokenizer = build_tokenizer(config, vocab_size);
  mesh.group("world").barrier();
  if (mesh.rank() != 0) tokenizer = build_tokenizer(config, vocab_size);
  return tokenizer;
}

at::Device pick_device() {
  if (!at::hasCUDA()) return at::Device(at::kCPU);
  const int64_t local_rank = dist::read_launch_env().local_rank;
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank % at::getNumGPUs()));
}

int run(const Options& o, const JobConfig& config) {
  const at::Device device = pick_device();
  const std::string backend = config.comm.backend != "auto" ? config.comm.backend
                              : device.is_cuda()            ? "nccl"
                                                            : "gloo";  // strict on CPUs too
  const dist::Mesh mesh = dist::Mesh::from_launch_env(config.parallelism, {.backend = backend});
  log::set_rank(static_cast<int>(mesh.rank()));
  TITAN_CHECK_NOT_IMPLEMENTED(
      mesh.size("pp") == 1 && mesh.size("cp") == 1,
      "[titan-generate] expected only tensor parallelism (parallelism.tensor_parallel_degree), got pp {} and cp {}. "
      "Unset parallelism.pipeline_parallel_degree and context_parallel_degree.",
      mesh.size("pp"), mesh.size("cp"));

  const Source source = resolve(o.checkpoint);
  // The shapes first (on meta, for one position): the vocabulary bounds the prompts.
  const models::DecoderShape shape = build_model(source, config, 1, at::kMeta)->shape();
  const auto tokenizer = tokenizer_of(o, source, config, shape.vocab_size, mesh);
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& text : o.prompts) {
    const auto ids = tokenizer->encode(text, o.add_bos);
    prompts.emplace_back(ids.begin(), ids.end());
  }
  prompts.insert(prompts.end(), o.prompt_ids.begin(), o.prompt_ids.end());
  int64_t longest = 0;
  for (const auto& p : prompts) {
    longest = std::max(longest, static_cast<int64_t>(p.size()));
    for (const int64_t id : p) {
      TITAN_CHECK_VALUE(id >= 0 && id < shape.vocab_size,
                        "[titan-generate] expected prompt token ids in [0, {}) (the model's vocabulary), got {}. Use "
                        "the tokenizer the model was trained with (--model.hf_assets_path).",
                        shape.vocab_size, id);
    }
  }
  // The model with RoPE tables for exactly prompt + new tokens (past the flavor's max_seq_len with torchtitan's
  // warning, as training takes a longer sequence), tensor-parallel when tp > 1 (the
  // training plan without sequence or loss parallel: a step of one token cannot be split by sequence,
  // and sampling wants whole logits), then the weights (each rank reading its shards).
  const auto model = build_model(source, config, longest + o.generate.max_new_tokens, device);
  parallel::ParallelPlan plan;
  if (mesh.size("tp") > 1) {
    plan.tensor_parallel = parallel::tensor_parallel_plan(model->sharding_spec(), mesh.size("tp"),
                                                          /*sequence_parallel=*/false, /*loss_parallel=*/false);
  }
  const Parallelized parallel = parallelize(*model, mesh, plan);
  const std::vector<at::Tensor> params = model->unique_parameters();
  checkpoint::State state;
  checkpoint::add_model(state, parameter_names(*model, params), params, &mesh);
  // MoE expert biases steer routing: buffers, under "moe.<fqn>" in a titan checkpoint (as the trainer saves
  // them) and mapped by the adapter (DeepSeek-V3's e_score_correction_bias) from Hugging Face.
  checkpoint::add_expert_biases(state, *model, source.hf ? "model" : "moe", &mesh);
  if (source.hf) {
    checkpoint::load_hf(source.folder, state, *model->hf_adapter());
  } else {
    checkpoint::load(source.folder, state, {"optimizer", "lr_scheduler", "dataloader", "train_state"});
  }
  log::info("Loaded {} ({} parameters, {}) from {} {}", shape.where, model->num_params(), parallel.describe(),
            source.hf ? "the Hugging Face folder" : "the titan checkpoint", source.folder.string());

  nn::GenerateConfig generate = o.generate;
  generate.eos_id = o.eos_id.value_or(tokenizer && tokenizer->eos_id() ? *tokenizer->eos_id() : -1);
  generate.pad_id = tokenizer && tokenizer->eos_id() ? *tokenizer->eos_id() : 0;
  const nn::CachedForward forward = [&](const at::Tensor& tokens, nn::KVCache& cache) {
    return model->forward_cached(tokens, cache);
  };
  const auto start = std::chrono::steady_clock::now();
  const nn::Generation out = nn::generate(forward, shape.n_layers, prompts, generate, device,
                                          mesh.size("tp") > 1 ? &mesh.group("tp") : nullptr);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t generated = 0;
  for (const auto& row : out.tokens) generated += static_cast<int64_t>(row.size());
  log::info("Generated {} tokens for {} prompts in {:.2f} s ({:.1f} tokens/s, prefill included)", generated,
            prompts.size(), seconds, static_cast<double>(generated) / seconds);
  if (mesh.rank() != 0) return 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    std::vector<int32_t> shown;
    for (const int64_t id : out.tokens[b]) {
      if (id != generate.eos_id) shown.push_back(static_cast<int32_t>(id));
    }
    const std::string text = tokenizer ? tokenizer->decode(shown) : std::string();
    const std::string prompt = b < o.prompts.size() ? o.prompts[b] : std::string();
    if (o.output == "jsonl") {
      std::cout << nlohmann::json{{"prompt", prompt},
                                  {"prompt_ids", prompts[b]},
                                  {"ids", out.tokens[b]},
                                  {"eos_id", generate.eos_id},
                                  {"text", text}}
                       .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                << "\n";
    } else {
      std::cout << fmt::format("--- [{}] ---\n{}{}\n", b, prompt, text);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const ToolArgs args = parse_tool_args(kSpec, argc, argv);
    if (args.help) {
      std::cout << tool_help(kSpec);
      return 0;
    }
    for (const auto& note : args.notes) log::warn("{}", note);
    return run(options_of(args), args.config);
  } catch (const std::exception& e) {
    std::cerr << "titan-generate: " << error_message(e) << "\n";
    return 1;
  }
}
