// SPDX-License-Identifier: BSD-3-Clause
// titan-convert: weights of any registered model (models/model_spec.hpp) between titan and Hugging Face layouts.
//   titan-convert to-hf --input PATH --output DIR [--like HF_DIR] [--max-shard-bytes N] [--base PATH]
//                       [--adapters merge|drop]
//                       [--model.name NAME --model.flavor NAME --checkpoint.export_dtype float32|bfloat16|float16]
//                       [--model.hf_assets_path TOKENIZER_DIR]
//     PATH: a titan checkpoint folder (<dump>/checkpoint/step-N) or a .safetensors file with titan
//     FQNs (a seed checkpoint, from-hf's output). DIR gets config.json and model.safetensors (or
//     shards + model.safetensors.index.json past max-shard-bytes), loadable by transformers'
//     from_pretrained, and the tokenizer of model.hf_assets_path (the job's, or --model.hf_assets_path DIR): its
//     tokenizer.json, tokenizer_config.json, special_tokens_map.json, tokenizer.model and generation_config.json
//     (else one naming its BOS/EOS), so AutoTokenizer.from_pretrained(DIR) works; without one a warning says so
//     (checkpoint/hf.hpp save_hf). The vocabulary size comes from the weights; the rest of the architecture from
//     model.name and model.flavor (the job's: --job.config_file of the run works) or, for a model that is
//     no titan flavor, from the config.json of --like HF_DIR. LoRA adapters in PATH (model.converters lora) are
//     folded into their weights (merge, the default) or left out (drop: the base alone); --base PATH (titan weights
//     as --input, or an HF folder) gives the base weights an adapter-only checkpoint (lora.save_adapter_only) lacks.
//   titan-convert to-peft --input PATH --output DIR [--like HF_DIR] [--base-model NAME]
//     The LoRA adapters of PATH as a PEFT adapter folder (adapter_model.safetensors + adapter_config.json) for the
//     HF model to-hf makes of the base: peft.PeftModel.from_pretrained(model, DIR) loads it. It carries the
//     tokenizer of model.hf_assets_path as to-hf's output does.
//   titan-convert from-hf --input DIR --output FILE.safetensors
//     DIR: an HF folder (single or sharded) of a registered family, picked by its config's
//     `architectures`. FILE holds titan FQNs and layouts; use it as checkpoint.initial_load_path (or give
//     DIR itself with checkpoint.initial_load_in_hf).
//   titan-convert from-dcp --input DIR --output STEP_DIR [--model.name llama3|qwen3 --model.flavor NAME]
//     DIR: a torchtitan checkpoint (torch.distributed.checkpoint, <dump>/checkpoint/step-N). STEP_DIR gets a titan
//     checkpoint of its model, AdamW state, schedule step and train step (docs/checkpoint.md: what carries over),
//     loadable on any layout: checkpoint.initial_load_path STEP_DIR with checkpoint.initial_load_model_only false.
//   titan-convert to-dcp --input STEP_DIR --output DIR [--job.config_file run.toml]
//     A titan checkpoint as a torchtitan one: torchtitan resumes from DIR (checkpoint.exclude_from_loading
//     ["dataloader"]). The optimizer's and schedule's settings (param_groups, LambdaLR) come from the job's config.
// Every other flag is a config key, as the trainer takes it (core/tool_args.hpp); a LoRA checkpoint's own settings
// (rank, alpha) win over --lora.* keys, which serve .safetensors inputs.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <string>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/dcp.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/checkpoint/peft.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/checkpoint/torchtitan.hpp"
#include "titan/core/choices.hpp"
#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/tool_args.hpp"
#include "titan/models/decoder.hpp"
#include "titan/models/job_args.hpp"
#include "titan/models/model_spec.hpp"
#include "titan/nn/lora.hpp"
#include "titan/optim/lr_schedule.hpp"
#include "titan/train/trainer.hpp"

namespace fs = std::filesystem;
namespace ckpt = titan::checkpoint;

namespace {

const titan::ToolSpec kSpec = {
    .name = "titan-convert",
    .usage =
        "usage: titan-convert to-hf --input PATH --output DIR [--like HF_DIR] [--max-shard-bytes N] [--base PATH]\n"
        "                           [--adapters merge|drop] [--model.name NAME] [--model.flavor NAME]\n"
        "                           [--checkpoint.export_dtype D] [--model.hf_assets_path TOKENIZER_DIR]\n"
        "       titan-convert to-peft --input PATH --output DIR [--like HF_DIR] [--base-model NAME]\n"
        "       titan-convert from-hf --input DIR --output FILE.safetensors\n"
        "       titan-convert from-dcp --input DIR --output STEP_DIR [--model.name N] [--model.flavor F]\n"
        "       titan-convert to-dcp --input STEP_DIR --output DIR [--job.config_file run.toml]\n",
    .flags = {{.name = "--input",
               .value = "PATH",
               .help = "to-hf, to-peft, to-dcp: a titan step folder (to-hf, to-peft: or .safetensors); from-hf: an HF "
                       "folder; from-dcp: a torchtitan (DCP) step folder"},
              {.name = "--output",
               .value = "PATH",
               .help = "to-hf: the HF folder to write; to-peft: the PEFT folder; from-hf: a .safetensors file; "
                       "from-dcp: the titan step folder; to-dcp: the torchtitan (DCP) step folder"},
              {.name = "--like",
               .value = "HF_DIR",
               .help =
                   "to-hf, to-peft: the architecture from this HF folder's config.json instead of model.name/flavor"},
              {.name = "--max-shard-bytes", .value = "N", .help = "to-hf: bytes per safetensors shard (default 5 GiB)"},
              {.name = "--base",
               .value = "PATH",
               .help =
                   "to-hf: base weights (titan step folder, .safetensors or HF folder) for an adapter-only checkpoint"},
              {.name = "--adapters",
               .value = "merge|drop",
               .help = "to-hf: fold LoRA adapters into their weights (default) or leave them out"},
              {.name = "--base-model",
               .value = "NAME",
               .help = "to-peft: adapter_config.json's base_model_name_or_path (an HF folder or hub name)"}},
    .renamed = {{.flag = "--model", .instead = "--model.name NAME"},
                {.flag = "--flavor", .instead = "--model.flavor NAME"},
                {.flag = "--dtype", .instead = "--checkpoint.export_dtype float32|bfloat16|float16"},
                {.flag = "--tokenizer", .instead = "--model.hf_assets_path TOKENIZER_DIR"}},
    .keys =
        "model.name, model.flavor (to-hf, to-peft), model.hf_assets_path or model.tokenizer_path (to-hf, "
        "to-peft: the tokenizer the export carries), checkpoint.export_dtype (to-hf, to-peft), lora.rank and "
        "lora.alpha (a .safetensors input's adapters), optimizer.*, lr_scheduler.*, training.steps, "
        "training.local_batch_size, training.global_batch_size, training.seq_len (to-dcp)",
    .words = "the command (to-hf, to-peft, from-hf, from-dcp or to-dcp)"};

using Named = std::vector<std::pair<std::string, at::Tensor>>;

// The adapter's HF name for a titan name; empty where it names none or refuses the name.
std::string hf_name_or_empty(const ckpt::HfAdapter& adapter, const std::string& fqn) {
  try {
    return adapter.hf_name(fqn);
  } catch (const c10::Error&) {
    return "";
  }
}

// What a titan input holds: model weights (LoRA adapters among them: X.lora_a.weight, X.lora_b.weight) and, from a
// LoRA run's checkpoint, its settings (values "lora"; null otherwise).
struct TitanWeights {
  Named tensors{};
  nlohmann::json lora{};
};

// The tensors of a titan checkpoint folder whose key `keep` accepts, whole, and the values checkpoint::load gives.
std::pair<ckpt::State, nlohmann::json> read_titan_folder(const fs::path& input,
                                                         const std::function<bool(const std::string&)>& keep) {
  std::ifstream in(input / "index.json");
  if (!in)
    throw std::invalid_argument(
        fmt::format("expected a titan checkpoint folder with index.json, got '{}'", input.string()));
  const auto index = nlohmann::json::parse(in);
  ckpt::State state;
  for (const auto& [key, entry] : index.at("tensors").items()) {
    if (!keep(key)) continue;
    const auto shape = entry.at("global_shape").get<std::vector<int64_t>>();
    at::Tensor whole = at::empty(shape, at::TensorOptions().dtype(ckpt::scalar_type(entry.at("dtype"))));
    state.tensors.push_back(ckpt::state_tensor(key, whole, /*mesh=*/nullptr));
  }
  nlohmann::json values = ckpt::load(input, state);
  return {std::move(state), std::move(values)};
}

// Every model tensor of a titan checkpoint folder or FQN-keyed safetensors file, whole.
TitanWeights read_titan(const fs::path& input) {
  TitanWeights out;
  if (input.extension() == ".safetensors") {
    const ckpt::SafetensorsFile file(input);
    for (const auto& [name, _] : file.entries()) out.tensors.emplace_back(name, file.read(name));
    return out;
  }
  // The model (LoRA adapters too) and the MoE expert biases (buffers the trainer saves as "moe.<fqn>"; HF has them).
  const auto [state, values] = read_titan_folder(
      input, [](const std::string& key) { return ckpt::is_model_group(key) || ckpt::group_of(key) == "moe"; });
  for (const auto& st : state.tensors) out.tensors.emplace_back(st.key.substr(st.key.find('.') + 1), st.tensor);
  if (values.contains("lora")) out.lora = values.at("lora");
  return out;
}

// An HF folder's weights under titan's names and layouts, with the model (on the CPU) they fill.
struct HfAsTitan {
  std::shared_ptr<titan::models::Decoder> model;
  const titan::models::ModelSpec* spec = nullptr;
  Named tensors{};
};

// The model filled through its adapter as checkpoint.initial_load_in_hf fills it, MoE expert biases where the
// family's HF twin stores them (DeepSeek-V3's e_score_correction_bias): to-hf gives them back; a twin without them
// (Qwen3-MoE, gpt-oss) leaves them out.
HfAsTitan read_hf_as_titan(const fs::path& input) {
  const ckpt::HfReader reader(input);
  const nlohmann::json hf = reader.config();
  HfAsTitan out;
  out.spec = &titan::models::model_spec_for_hf(hf);
  out.model = out.spec->from_hf(hf, 1, at::kCPU);
  const std::vector<at::Tensor> params = out.model->unique_parameters();
  ckpt::State state;
  ckpt::add_model(state, titan::parameter_names(*out.model, params), params, nullptr);
  const auto adapter = out.model->hf_adapter();
  ckpt::State biases;
  ckpt::add_expert_biases(biases, *out.model, "model", nullptr);
  const std::vector<std::string> hf_names = reader.names();
  for (auto& st : biases.tensors) {
    const std::string hf_name = hf_name_or_empty(*adapter, st.key.substr(std::string("model.").size()));
    if (std::find(hf_names.begin(), hf_names.end(), hf_name) != hf_names.end()) state.tensors.push_back(std::move(st));
  }
  ckpt::load_hf(input, state, *adapter);
  for (const auto& st : state.tensors) out.tensors.emplace_back(st.key.substr(std::string("model.").size()), st.tensor);
  return out;
}

// The LoRA adapters of `tensors` taken out of it.
Named take_adapters(Named& tensors) {
  const auto first = std::stable_partition(tensors.begin(), tensors.end(),
                                           [](const auto& named) { return !titan::nn::is_lora_param(named.first); });
  Named adapters(std::make_move_iterator(first), std::make_move_iterator(tensors.end()));
  tensors.erase(first, tensors.end());
  return adapters;
}

// A checkpoint's LoRA settings, else the --lora.* keys'.
nlohmann::json lora_settings(const TitanWeights& weights, const titan::ToolArgs& args) {
  if (!weights.lora.is_null()) return weights.lora;
  return {{"rank", args.config.lora.rank}, {"alpha", args.config.lora.alpha}, {"dropout", args.config.lora.dropout}};
}

// The architecture on meta (shapes only), for its Hugging Face adapter: from --like, else model.name/flavor with
// the weights' vocabulary (0: the flavor's).
std::shared_ptr<titan::models::Decoder> meta_model(const titan::ToolArgs& args, int64_t vocab) {
  if (const auto like = args.value("--like")) {
    nlohmann::json hf = ckpt::HfReader(*like).config();
    if (vocab > 0) hf["vocab_size"] = vocab;
    return titan::models::model_spec_for_hf(hf).from_hf(hf, 1, at::kMeta);
  }
  // training.seq_len as given (the trainer's default 2048 otherwise): it is the export's max_position_embeddings,
  // which a reader of the HF folder (titan-eval, titan-generate) takes as the longest sequence the model may see.
  return titan::models::build_model(args.config, vocab, {.device = at::kMeta});
}

void to_hf(const titan::ToolArgs& args) {
  const std::string input = args.required("--input");
  TitanWeights weights = read_titan(input);
  Named& tensors = weights.tensors;
  Named adapters = take_adapters(tensors);
  if (const auto base = args.value("--base")) {
    TITAN_CHECK_VALUE(tensors.empty(),
                      "[titan-convert] expected --base only for an input without base weights (an adapter-only "
                      "checkpoint), got {} base tensors in '{}'. Leave --base out.",
                      tensors.size(), input);
    tensors = fs::exists(fs::path(*base) / "config.json") ? read_hf_as_titan(*base).tensors : read_titan(*base).tensors;
    (void)take_adapters(tensors);  // a base is its weights alone
  }
  const std::string mode = args.value("--adapters").value_or("merge");
  TITAN_CHECK_VALUE(mode == "merge" || mode == "drop", "[titan-convert] expected --adapters merge or drop, got '{}'.",
                    mode);
  if (!adapters.empty() && mode == "merge") {
    if (const auto nf4 = ckpt::nf4_base_dtype(weights.lora)) {
      tensors = ckpt::nf4_bases(std::move(tensors), adapters, *nf4);
      titan::log::info("QLoRA checkpoint: merging into the dequantised NF4 bases, the weights the adapters trained on");
    }
    tensors = ckpt::merge_lora(std::move(tensors), adapters, ckpt::lora_scale(lora_settings(weights, args)));
    titan::log::info("Folded {} LoRA adapters into their weights", adapters.size() / 2);
  }
  int64_t vocab = 0;
  bool has_output = false;
  for (const auto& [fqn, t] : tensors) {
    if (fqn == "tok_embeddings.weight") vocab = t.size(0);
    has_output = has_output || fqn == "output.weight";
  }
  const std::shared_ptr<titan::models::Decoder> model = meta_model(args, vocab);
  const titan::ModelConfig& named = args.config.model;
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
                args.integer("--max-shard-bytes", ckpt::kHfMaxShardBytes),
                named.tokenizer_path.value_or(named.hf_assets_path));
  titan::log::info("Converted {} titan tensors to Hugging Face layout in {}", tensors.size(), output);
}

void to_peft(const titan::ToolArgs& args) {
  const std::string input = args.required("--input");
  TitanWeights weights = read_titan(input);
  const Named adapters = take_adapters(weights.tensors);
  TITAN_CHECK_VALUE(!adapters.empty(),
                    "[titan-convert] expected LoRA adapters (X.lora_a.weight, X.lora_b.weight) in '{}', got none. "
                    "Give a checkpoint of a run with model.converters lora.",
                    input);
  const auto model = meta_model(args, 0);  // names and row layouts do not depend on the vocabulary
  const auto adapter = model->hf_adapter();
  if (!adapter)
    throw std::invalid_argument(
        fmt::format("expected a model with a Hugging Face twin, got {}", args.config.model.name));
  const std::string output = args.required("--output");
  ckpt::save_peft(output, adapters, *adapter,
                  {.lora = lora_settings(weights, args),
                   .dtype = titan::scalar_type(args.config.checkpoint.export_dtype),
                   .base_model = args.value("--base-model").value_or(""),
                   .tokenizer = args.config.model.tokenizer_path.value_or(args.config.model.hf_assets_path)});
  titan::log::info("Wrote {} LoRA adapter tensors as a PEFT adapter to {}", adapters.size(), output);
}

void from_hf(const titan::ToolArgs& args) {
  const std::string input = args.required("--input");
  const std::string output = args.required("--output");
  const HfAsTitan read = read_hf_as_titan(input);
  ckpt::write_safetensors(output, read.tensors, {{"format", "pt"}, {"writer", "titan-convert from-hf"}});
  const titan::models::DecoderShape& s = read.model->shape();
  titan::log::info(
      "Wrote {} tensors of a {} model with titan names to {} (dim {}, {} layers, {} heads, {} kv heads, "
      "vocab {})",
      read.tensors.size(), read.spec->name, output, s.dim, s.n_layers, s.n_heads, s.n_kv_heads, s.vocab_size);
}

// The twin of model.name whose checkpoints titan converts, and how it orders q/k rows: torchtitan's Llama 3 rotates
// pairs as titan does (nothing to permute), its Qwen3 rotates halves as Hugging Face does (the HF adapter permutes).
std::shared_ptr<const ckpt::HfAdapter> torchtitan_halves(const titan::ToolArgs& args,
                                                         const titan::models::Decoder& model) {
  const std::string& family = args.config.model.name;
  TITAN_CHECK_VALUE(family == "llama3" || family == "qwen3",
                    "[titan-convert] expected --model.name llama3 or qwen3 (the families whose torchtitan checkpoints "
                    "titan converts), got '{}'.",
                    family);
  return family == "qwen3" ? model.hf_adapter() : nullptr;
}

void from_dcp(const titan::ToolArgs& args) {
  const std::string input = args.required("--input");
  const std::string output = args.required("--output");
  const ckpt::DcpReader dcp(input);
  const auto embedding = dcp.tensors().find("tok_embeddings.weight");
  TITAN_CHECK_VALUE(embedding != dcp.tensors().end() && embedding->second.shape.size() == 2,
                    "[titan-convert] expected a torchtitan model's tok_embeddings.weight (V, D) in '{}', got none.",
                    input);
  const auto model = meta_model(args, embedding->second.shape[0]);
  const auto halves = torchtitan_halves(args, *model);
  const std::vector<at::Tensor> params = model->unique_parameters();
  const ckpt::State state =
      ckpt::state_from_torchtitan(dcp, {.params = titan::parameter_names(*model, params), .halves = halves.get()});
  const int64_t step = state.values.at("train_state").at("step").get<int64_t>();
  ckpt::write_titan_checkpoint(output, state, step);
  titan::log::info("Wrote torchtitan's step {} ({} tensors) as a titan checkpoint to {}", step, state.tensors.size(),
                   output);
}

void to_dcp(const titan::ToolArgs& args) {
  const std::string input = args.required("--input");
  const std::string output = args.required("--output");
  const auto [state, values] = read_titan_folder(input, [](const std::string&) { return true; });
  int64_t vocab = 0;
  for (const auto& st : state.tensors) {
    if (st.key == "model.tok_embeddings.weight") vocab = st.tensor.size(0);
  }
  const auto model = meta_model(args, vocab);
  const auto halves = torchtitan_halves(args, *model);
  const titan::JobConfig& c = args.config;
  const int64_t step = values.value("step", int64_t{0});
  const int64_t batch = c.training.global_batch_size > 0 ? c.training.global_batch_size : c.training.local_batch_size;
  const auto entries =
      ckpt::torchtitan_entries(state, values,
                               {.halves = halves.get(),
                                .tied = model->shape().tied,
                                .optimizer = c.optimizer,
                                .lr_factor = titan::LRSchedule(c.lr_scheduler, c.training.steps).factor(step),
                                .tokens_per_step = batch * c.training.seq_len});
  ckpt::write_dcp(output, entries);
  titan::log::info(
      "Wrote titan's step {} ({} items) as a torchtitan checkpoint to {}; resume it in torchtitan with "
      "checkpoint.exclude_from_loading [\"dataloader\"]",
      step, entries.size(), output);
}

}  // namespace

int main(int argc, char** argv) {
  return titan::run_tool(kSpec, argc, argv, [&](const titan::ToolArgs& args) {
    const std::string command = args.words.size() == 1 ? args.words[0] : "";
    TITAN_CHECK_VALUE(command == "to-hf" || command == "to-peft" || command == "from-hf" || command == "from-dcp" ||
                          command == "to-dcp",
                      "[titan-convert] expected one command, to-hf, to-peft, from-hf, from-dcp or to-dcp, before the "
                      "flags, got '{}'.\n{}",
                      fmt::join(args.words, " "), kSpec.usage);
    if (command == "to-hf") {
      to_hf(args);
    } else if (command == "to-peft") {
      to_peft(args);
    } else if (command == "from-hf") {
      from_hf(args);
    } else if (command == "from-dcp") {
      from_dcp(args);
    } else {
      to_dcp(args);
    }
    return 0;
  });
}
