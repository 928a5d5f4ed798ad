// SPDX-License-Identifier: BSD-3-Clause
// titan-convert: weights of any registered model (models/model_spec.hpp) between titan and Hugging Face layouts.
//   titan-convert to-hf --input PATH --output DIR [--like HF_DIR] [--max-shard-bytes N]
//                       [--model.name NAME --model.flavor NAME --checkpoint.export_dtype float32|bfloat16|float16]
//     PATH: a titan checkpoint folder (<dump>/checkpoint/step-N) or a .safetensors file with titan
//     FQNs (a seed checkpoint, from-hf's output). DIR gets config.json and model.safetensors (or
//     shards + model.safetensors.index.json past max-shard-bytes), loadable by transformers'
//     from_pretrained. The vocabulary size comes from the weights; the rest of the architecture from
//     model.name and model.flavor (the job's: --job.config_file of the run works) or, for a model that is
//     no titan flavor, from the config.json of --like HF_DIR.
//   titan-convert from-hf --input DIR --output FILE.safetensors
//     DIR: an HF folder (single or sharded) of a registered family, picked by its config's
//     `architectures`. FILE holds titan FQNs and layouts; use it as checkpoint.initial_load_path (or give
//     DIR itself with checkpoint.initial_load_in_hf).
// Every other flag is a config key, as the trainer takes it (core/tool_args.hpp).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/choices.hpp"
#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/tool_args.hpp"
#include "titan/models/decoder.hpp"
#include "titan/models/job_args.hpp"
#include "titan/models/model_spec.hpp"
#include "titan/train/trainer.hpp"

namespace fs = std::filesystem;
namespace ckpt = titan::checkpoint;

namespace {

const titan::ToolSpec kSpec = {
    .name = "titan-convert",
    .usage =
        "usage: titan-convert to-hf --input PATH --output DIR [--like HF_DIR] [--max-shard-bytes N]\n"
        "                           [--model.name NAME] [--model.flavor NAME] [--checkpoint.export_dtype D]\n"
        "       titan-convert from-hf --input DIR --output FILE.safetensors\n",
    .flags =
        {{.name = "--input",
          .value = "PATH",
          .help = "to-hf: a titan step folder or .safetensors; from-hf: an HF folder"},
         {.name = "--output", .value = "PATH", .help = "to-hf: the HF folder to write; from-hf: a .safetensors file"},
         {.name = "--like",
          .value = "HF_DIR",
          .help = "to-hf: the architecture from this HF folder's config.json instead of model.name/flavor"},
         {.name = "--max-shard-bytes", .value = "N", .help = "to-hf: bytes per safetensors shard (default 5 GiB)"}},
    .renamed = {{.flag = "--model", .instead = "--model.name NAME"},
                {.flag = "--flavor", .instead = "--model.flavor NAME"},
                {.flag = "--dtype", .instead = "--checkpoint.export_dtype float32|bfloat16|float16"}},
    .keys = "model.name, model.flavor (to-hf), checkpoint.export_dtype (to-hf)",
    .words = "the command (to-hf or from-hf)"};

// Every model tensor of a titan checkpoint folder or FQN-keyed safetensors file, whole.
std::vector<std::pair<std::string, at::Tensor>> read_titan(const fs::path& input) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (input.extension() == ".safetensors") {
    const ckpt::SafetensorsFile file(input);
    for (const auto& [name, _] : file.entries()) out.emplace_back(name, file.read(name));
    return out;
  }
  std::ifstream in(input / "index.json");
  if (!in)
    throw std::invalid_argument(
        fmt::format("expected a titan checkpoint folder with index.json, got '{}'", input.string()));
  const auto index = nlohmann::json::parse(in);
  ckpt::State state;
  for (const auto& [key, entry] : index.at("tensors").items()) {
    // The model and the MoE expert biases (buffers the trainer saves as "moe.<fqn>"; HF has them too).
    if (ckpt::group_of(key) != "model" && ckpt::group_of(key) != "moe") continue;
    const auto shape = entry.at("global_shape").get<std::vector<int64_t>>();
    at::Tensor whole = at::empty(shape, at::TensorOptions().dtype(ckpt::scalar_type(entry.at("dtype"))));
    state.tensors.push_back(ckpt::state_tensor(key, whole, /*mesh=*/nullptr));
  }
  ckpt::load(input, state);
  for (const auto& st : state.tensors) out.emplace_back(st.key.substr(st.key.find('.') + 1), st.tensor);
  return out;
}

// The adapter's HF name for a titan name; empty where it names none or refuses the name.
std::string hf_name_or_empty(const ckpt::HfAdapter& adapter, const std::string& fqn) {
  try {
    return adapter.hf_name(fqn);
  } catch (const c10::Error&) {
    return "";
  }
}

void to_hf(const titan::ToolArgs& args) {
  const std::string input = args.required("--input");
  auto tensors = read_titan(input);
  int64_t vocab = 0;
  bool has_output = false;
  for (const auto& [fqn, t] : tensors) {
    if (fqn == "tok_embeddings.weight") vocab = t.size(0);
    has_output = has_output || fqn == "output.weight";
  }
  // The architecture on meta (shapes only), for its Hugging Face adapter.
  std::shared_ptr<titan::models::Decoder> model;
  const titan::ModelConfig& named = args.config.model;
  if (const auto like = args.value("--like")) {
    nlohmann::json hf = ckpt::HfReader(*like).config();
    if (vocab > 0) hf["vocab_size"] = vocab;
    model = titan::models::model_spec_for_hf(hf).from_hf(hf, 1, at::kMeta);
  } else {
    titan::JobConfig config = args.config;
    config.training.seq_len = 1;
    model = titan::models::build_model(config, vocab, {.device = at::kMeta});
  }
  if (model->shape().tied == has_output) {
    throw std::invalid_argument(fmt::format(
        "expected {} output.weight in '{}' ({} {} {} tie its embeddings), got {}. Pick the model and flavor the "
        "weights were trained with (--model.name, --model.flavor, or the run's --job.config_file) or --like a matching "
        "Hugging Face folder",
        model->shape().tied ? "no" : "an", input, named.name, named.flavor, model->shape().tied ? "does" : "does not",
        has_output ? "one" : "none"));
  }
  const auto adapter = model->hf_adapter();
  // An MoE expert bias goes to HF only where the family's HF twin has one (DeepSeek-V3's
  // e_score_correction_bias); other adapters name no HF tensor for it, or refuse the name.
  std::erase_if(tensors, [&](const auto& named) {
    return named.first.ends_with(".expert_bias") &&
           (adapter == nullptr || hf_name_or_empty(*adapter, named.first).empty());
  });
  if (!adapter)
    throw std::invalid_argument(fmt::format("expected a model with a Hugging Face twin, got {}", named.name));
  const std::string output = args.required("--output");
  ckpt::save_hf(output, tensors, *adapter, titan::scalar_type(args.config.checkpoint.export_dtype),
                args.integer("--max-shard-bytes", int64_t{5} << 30));
  titan::log::info("Converted {} titan tensors to Hugging Face layout in {}", tensors.size(), output);
}

void from_hf(const titan::ToolArgs& args) {
  const std::string input = args.required("--input");
  const std::string output = args.required("--output");
  const ckpt::HfReader reader(input);
  const nlohmann::json hf = reader.config();
  const titan::models::ModelSpec& spec = titan::models::model_spec_for_hf(hf);
  // The model on the CPU, filled through its adapter as checkpoint.initial_load_in_hf fills it.
  const auto model = spec.from_hf(hf, 1, at::kCPU);
  const std::vector<at::Tensor> params = model->unique_parameters();
  ckpt::State state;
  ckpt::add_model(state, titan::parameter_names(*model, params), params, nullptr);
  // MoE expert biases where the family's HF twin stores them (DeepSeek-V3's e_score_correction_bias): to-hf
  // gives them back; a twin without them (Qwen3-MoE, gpt-oss) leaves them out.
  const auto adapter = model->hf_adapter();
  ckpt::State biases;
  ckpt::add_expert_biases(biases, *model, "model", nullptr);
  const std::vector<std::string> hf_names = reader.names();
  for (auto& st : biases.tensors) {
    const std::string hf_name = hf_name_or_empty(*adapter, st.key.substr(std::string("model.").size()));
    if (std::find(hf_names.begin(), hf_names.end(), hf_name) != hf_names.end()) state.tensors.push_back(std::move(st));
  }
  ckpt::load_hf(input, state, *adapter);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& st : state.tensors) out.emplace_back(st.key.substr(std::string("model.").size()), st.tensor);
  ckpt::write_safetensors(output, out, {{"format", "pt"}, {"writer", "titan-convert from-hf"}});
  const titan::models::DecoderShape& s = model->shape();
  titan::log::info(
      "Wrote {} tensors of a {} model with titan names to {} (dim {}, {} layers, {} heads, {} kv heads, "
      "vocab {})",
      out.size(), spec.name, output, s.dim, s.n_layers, s.n_heads, s.n_kv_heads, s.vocab_size);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const titan::ToolArgs args = titan::parse_tool_args(kSpec, argc, argv);
    if (args.help) {
      std::cout << titan::tool_help(kSpec);
      return 0;
    }
    for (const auto& note : args.notes) titan::log::warn("{}", note);
    const std::string command = args.words.size() == 1 ? args.words[0] : "";
    TITAN_CHECK_VALUE(command == "to-hf" || command == "from-hf",
                      "[titan-convert] expected one command, to-hf or from-hf, before the flags, got '{}'.\n{}",
                      fmt::join(args.words, " "), kSpec.usage);
    command == "to-hf" ? to_hf(args) : from_hf(args);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "titan-convert: " << titan::error_message(e) << "\n";
    return 1;
  }
}
