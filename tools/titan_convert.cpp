// SPDX-License-Identifier: BSD-3-Clause
// titan-convert: Llama 3 weights between titan and Hugging Face layouts.
//   titan-convert to-hf --input PATH --output DIR [--flavor NAME | --like HF_DIR]
//                       [--dtype float32|bfloat16|float16] [--max-shard-bytes N]
//     PATH: a titan checkpoint folder (<dump>/checkpoint/step-N) or a .safetensors file with titan
//     FQNs (a seed checkpoint, from-hf's output). DIR gets config.json and model.safetensors (or
//     shards + model.safetensors.index.json past max-shard-bytes), loadable by transformers'
//     LlamaForCausalLM.from_pretrained. The vocabulary size and embedding tying come from the
//     weights; the rest of the architecture from --flavor (default debugmodel) or, for a model
//     that is no titan flavor, from the config.json of --like HF_DIR.
//   titan-convert from-hf --input DIR --output FILE.safetensors
//     DIR: an HF Llama folder (single or sharded). FILE holds titan FQNs and layouts; use it as
//     checkpoint.initial_load_path (or give DIR itself with checkpoint.initial_load_in_hf).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/choices.hpp"
#include "titan/core/log.hpp"
#include "titan/models/llama3/hf_adapter.hpp"

namespace fs = std::filesystem;
namespace ckpt = titan::checkpoint;

namespace {

constexpr const char* kUsage =
    "usage: titan-convert to-hf --input PATH --output DIR [--flavor NAME | --like HF_DIR]\n"
    "                           [--dtype float32|bfloat16|float16] [--max-shard-bytes N]\n"
    "       titan-convert from-hf --input DIR --output FILE.safetensors\n";

std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> flags = {
      {"flavor", "debugmodel"}, {"dtype", "float32"}, {"max-shard-bytes", std::to_string(int64_t{5} << 30)}};
  for (int i = 2; i < argc; i += 2) {
    const std::string key = argv[i];
    const bool known = key.starts_with("--") &&
                       (flags.contains(key.substr(2)) || key == "--input" || key == "--output" || key == "--like");
    if (!known || i + 1 >= argc)
      throw std::invalid_argument(fmt::format("unknown or incomplete flag {}\n{}", key, kUsage));
    flags[key.substr(2)] = argv[i + 1];
  }
  if (!flags.contains("input") || !flags.contains("output")) throw std::invalid_argument(kUsage);
  return flags;
}

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
    if (ckpt::group_of(key) != "model") continue;
    const auto shape = entry.at("global_shape").get<std::vector<int64_t>>();
    at::Tensor whole = at::empty(shape, at::TensorOptions().dtype(ckpt::scalar_type(entry.at("dtype"))));
    state.tensors.push_back(ckpt::state_tensor(key, whole, /*mesh=*/nullptr));
  }
  ckpt::load(input, state);
  for (const auto& st : state.tensors) out.emplace_back(st.key.substr(6), st.tensor);
  return out;
}

at::ScalarType dtype_of(const std::string& name) {
  const std::optional<titan::DType> dtype = titan::parse_choice<titan::DType>(name);
  if (!dtype) {
    throw std::invalid_argument(fmt::format("expected --dtype {}, got '{}'", titan::choice_list<titan::DType>(), name));
  }
  return titan::scalar_type(*dtype);
}

void to_hf(const std::map<std::string, std::string>& flags) {
  const auto tensors = read_titan(flags.at("input"));
  titan::llama3::Llama3Args args = flags.contains("like")
                                       ? titan::llama3::args_from_hf_config(ckpt::HfReader(flags.at("like")).config())
                                       : titan::llama3::flavor(flags.at("flavor"));
  bool has_output = false;
  for (const auto& [fqn, t] : tensors) {
    if (fqn == "tok_embeddings.weight") args.vocab_size = t.size(0);
    has_output = has_output || fqn == "output.weight";
  }
  args.tie_word_embeddings = !has_output;
  ckpt::save_hf(flags.at("output"), tensors, *titan::llama3::hf_adapter(args), dtype_of(flags.at("dtype")),
                std::stoll(flags.at("max-shard-bytes")));
  titan::log::info("Wrote {} tensors in Hugging Face layout to {}", tensors.size(), flags.at("output"));
}

void from_hf(const std::map<std::string, std::string>& flags) {
  const ckpt::HfReader reader(flags.at("input"));
  const titan::llama3::Llama3Args args = titan::llama3::args_from_hf_config(reader.config());
  const auto adapter = titan::llama3::hf_adapter(args);
  std::vector<std::string> fqns = {"tok_embeddings.weight"};
  for (int64_t i = 0; i < args.n_layers; ++i) {
    for (const char* name : {"attention.wq.weight", "attention.wk.weight", "attention.wv.weight", "attention.wo.weight",
                             "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight",
                             "attention_norm.weight", "ffn_norm.weight"}) {
      fqns.push_back(fmt::format("layers.{}.{}", i, name));
    }
  }
  fqns.push_back("norm.weight");
  if (!args.tie_word_embeddings) fqns.push_back("output.weight");
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& fqn : fqns) {
    std::string name = adapter->hf_name(fqn);
    if (!reader.contains(name) && !adapter->hf_fallback(fqn).empty()) name = adapter->hf_fallback(fqn);
    out.emplace_back(fqn, adapter->from_hf(fqn, reader.read(name)).contiguous());
  }
  ckpt::write_safetensors(flags.at("output"), out, {{"format", "pt"}, {"writer", "titan-convert from-hf"}});
  titan::log::info("Wrote {} tensors with titan names to {} (dim {}, {} layers, {} heads, {} kv heads, vocab {})",
                   out.size(), flags.at("output"), args.dim, args.n_layers, args.n_heads, args.kv_heads(),
                   args.vocab_size);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string command = argc > 1 ? argv[1] : "";
    if (command != "to-hf" && command != "from-hf") {
      std::cerr << kUsage;
      return 2;
    }
    const auto flags = parse(argc, argv);
    command == "to-hf" ? to_hf(flags) : from_hf(flags);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "titan-convert: " << e.what() << "\n";
    return 1;
  }
}
