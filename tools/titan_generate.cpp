// SPDX-License-Identifier: BSD-3-Clause
// titan-generate: text from a checkpoint of any registered model (models/model_spec.hpp: Llama 3, Qwen3,
// Qwen3-MoE, DeepSeek-V3, ...), with a KV cache (docs/generation.md).
//   titan-generate [--checkpoint PATH] --prompt TEXT [--prompt TEXT ...] [--max-new-tokens N]
//                  [--greedy | --temperature T --top-k K --top-p P] [--eos-id ID] [--no-bos]
//                  [--output text|jsonl] [--prompt-ids 1,2,3] [--speculative-mtp]
//                  [config keys: --job.config_file FILE, --model.flavor NAME, --debug.seed S, ...]
//     PATH: a titan checkpoint (<dump>/checkpoint/step-N, or <dump>/checkpoint for its newest step;
//     the architecture comes from model.name and model.flavor, the vocabulary size from the weights) or a
//     Hugging Face folder (config.json + safetensors; its `architectures` picks the family); default: the
//     job's <job.dump_folder>/<checkpoint.folder>. Prompts of different lengths are one batch.
//   --speculative-mtp: greedy self-speculative decoding with DeepSeek-V3's multi-token prediction modules
//   (model.num_nextn_predict_layers > 0): the same tokens, fewer forwards; the accepted rate on the log.
//   titan-run --nproc-per-node 2 titan-generate ... --parallelism.tensor_parallel_degree 2   splits every
//   layer over 2 ranks.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/tool_args.hpp"
#include "titan/data/tokenizer.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/models/decoder.hpp"
#include "titan/models/deepseek_v3/model.hpp"
#include "titan/nn/generate.hpp"
#include "titan/nn/kv_cache.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/inference.hpp"

namespace fs = std::filesystem;
using namespace titan;

namespace {

const ToolSpec kSpec = {
    .name = "titan-generate",
    .usage =
        "usage: titan-generate [--checkpoint PATH] --prompt TEXT [--prompt TEXT ...] [--max-new-tokens N]\n"
        "                      [--greedy | --temperature T --top-k K --top-p P] [--eos-id ID] [--no-bos]\n"
        "                      [--output text|jsonl] [--prompt-ids 1,2,3] [--speculative-mtp]\n"
        "                      [config keys: --job.config_file FILE,\n"
        "                      --model.flavor NAME, --debug.seed S, --parallelism.tensor_parallel_degree N, ...]\n",
    .flags = {inference_checkpoint_flag(),
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
               .help = "the prompt and its continuation, or one JSON object a prompt"},
              {.name = "--speculative-mtp",
               .help = "greedy: draft with the multi-token prediction modules, verify with one forward (DeepSeek-V3)"}},
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
  /// Self-speculative greedy decoding with the model's multi-token prediction modules.
  bool speculative_mtp = false;
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
  o.checkpoint = inference_checkpoint_path(args);
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
  o.speculative_mtp = args.has("--speculative-mtp");
  TITAN_CHECK_VALUE(!o.speculative_mtp || o.generate.sampling.greedy(),
                    "[titan-generate] expected greedy decoding with --speculative-mtp (a draft is checked against the "
                    "argmax), got --temperature {}. Drop --temperature, or --speculative-mtp.",
                    o.generate.sampling.temperature);
  o.output = args.value("--output").value_or("text");
  TITAN_CHECK_VALUE(o.output == "text" || o.output == "jsonl",
                    "[titan-generate] expected --output text|jsonl, got '{}'.", o.output);
  TITAN_CHECK_VALUE(!o.prompts.empty() || !o.prompt_ids.empty(),
                    "[titan-generate] expected at least one --prompt TEXT or --prompt-ids 1,2,3, got none.");
  o.generate.sampling.validate();
  return o;
}

// Self-speculative decoding with a DeepSeek-V3 model's multi-token prediction modules; its counts on the log.
nn::Generation speculative(const models::Decoder& model, const std::vector<std::vector<int64_t>>& prompts,
                           const nn::GenerateConfig& generate, const at::Device& device, const dist::Mesh& mesh) {
  const auto* drafting = dynamic_cast<const deepseek_v3::DeepSeekV3*>(&model);
  TITAN_CHECK_VALUE(drafting != nullptr && drafting->mtp != nullptr,
                    "[titan-generate] expected a DeepSeek-V3 model with multi-token prediction modules for "
                    "--speculative-mtp, got {}. Set --model.num_nextn_predict_layers to the checkpoint's depth.",
                    drafting ? "none" : "another family");
  TITAN_CHECK_NOT_IMPLEMENTED(mesh.size("tp") == 1,
                              "[titan-generate] expected tensor_parallel_degree 1 with --speculative-mtp, got {}. "
                              "Drop one of them.",
                              mesh.size("tp"));
  nn::Generation out = nn::generate_speculative(drafting->drafting_model(), prompts, generate, device);
  const nn::SpeculativeStats& s = out.speculative;
  log::info(
      "Speculative decoding (MTP depth {}): {} of {} drafted tokens accepted ({:.1f}%), {} tokens in {} "
      "forwards of the main model ({:.2f} tokens a forward)",
      drafting->mtp->modules.size(), s.accepted, s.drafted, 100.0 * s.accepted_rate(), s.generated, s.forwards,
      s.tokens_per_forward());
  return out;
}

// With --output jsonl, stdout carries the JSON lines alone, so that a pipe or a file of them parses: from here on the
// log (which writes its info lines to stdout) goes to stderr, and the returned stream is the original stdout.
std::FILE* json_stream() {
  std::cout.flush();
  std::fflush(stdout);
  const int fd = ::dup(STDOUT_FILENO);
  TITAN_CHECK(fd >= 0 && ::dup2(STDERR_FILENO, STDOUT_FILENO) >= 0,
              "[titan-generate] expected to move the log from stdout to stderr for --output jsonl, got errno {}. Use "
              "--output text.",
              errno);
  std::FILE* out = ::fdopen(fd, "w");
  TITAN_CHECK(out != nullptr, "[titan-generate] expected to reopen stdout for --output jsonl, got errno {}.", errno);
  return out;
}

int run(const Options& o, const JobConfig& config) {
  std::FILE* const json_out = o.output == "jsonl" ? json_stream() : nullptr;
  const at::Device device = inference_device();
  const dist::Mesh mesh = inference_mesh(config, device);
  TITAN_CHECK_NOT_IMPLEMENTED(
      mesh.size("pp") == 1 && mesh.size("cp") == 1,
      "[titan-generate] expected only tensor parallelism (parallelism.tensor_parallel_degree), got pp {} and cp {}. "
      "Unset parallelism.pipeline_parallel_degree and context_parallel_degree.",
      mesh.size("pp"), mesh.size("cp"));

  const InferenceCheckpoint source = resolve_inference_checkpoint(o.checkpoint, kSpec.name);
  // The shapes first (on meta, for one position): the vocabulary bounds the prompts.
  const models::DecoderShape shape = build_inference_model(source, config, 1, at::kMeta, kSpec.name)->shape();
  // Prompts given as ids only need no tokenizer unless the checkpoint has one (it names EOS).
  const auto tokenizer = o.prompts.empty() && !has_own_tokenizer(source)
                             ? nullptr
                             : inference_tokenizer(source, config, shape.vocab_size, mesh);
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
  const auto model = build_inference_model(source, config, longest + o.generate.max_new_tokens, device, kSpec.name);
  parallel::ParallelPlan plan;
  if (mesh.size("tp") > 1) {
    plan.tensor_parallel = parallel::tensor_parallel_plan(model->sharding_spec(), mesh.size("tp"),
                                                          /*sequence_parallel=*/false, /*loss_parallel=*/false);
  }
  const Parallelized parallel = parallelize(*model, mesh, plan);
  load_inference_weights(*model, parallel, source, mesh);

  nn::GenerateConfig generate = o.generate;
  generate.eos_id = o.eos_id.value_or(tokenizer && tokenizer->eos_id() ? *tokenizer->eos_id() : -1);
  generate.pad_id = tokenizer && tokenizer->eos_id() ? *tokenizer->eos_id() : 0;
  const nn::CachedForward forward = [&](const at::Tensor& tokens, nn::KVCache& cache) {
    return model->forward_cached(tokens, cache);
  };
  const auto start = std::chrono::steady_clock::now();
  const nn::Generation out = o.speculative_mtp ? speculative(*model, prompts, generate, device, mesh)
                                               : nn::generate(forward, shape.n_layers, prompts, generate, device,
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
      fmt::print(json_out, "{}\n",
                 nlohmann::json{{"prompt", prompt},
                                {"prompt_ids", prompts[b]},
                                {"ids", out.tokens[b]},
                                {"eos_id", generate.eos_id},
                                {"text", text}}
                     .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      std::fflush(json_out);
    } else {
      std::cout << fmt::format("--- [{}] ---\n{}{}\n", b, prompt, text);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_tool(kSpec, argc, argv, [&](const ToolArgs& args) { return run(options_of(args), args.config); });
}
