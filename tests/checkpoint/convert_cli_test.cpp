// SPDX-License-Identifier: BSD-3-Clause
// titan-convert speaks the trainer's language: the architecture of to-hf comes from model.name and model.flavor
// (on the command line or in the job's file), the dtype from checkpoint.export_dtype; the flags they replaced
// are refused naming the key.
#include <fmt/format.h>

#include "test_util.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/config.hpp"
#include "titan/models/decoder.hpp"
#include "titan/models/job_args.hpp"
#include "titan/models/model_spec.hpp"
#include "titan/train/trainer.hpp"
#include "tool_run.hpp"

using namespace titan;
namespace fs = std::filesystem;

namespace {

test::ToolRun convert(const std::vector<std::string>& args) { return test::run_tool("titan-convert", args); }

}  // namespace

TEST_CASE("titan-convert to-hf takes the model from model.name and model.flavor on the line or in the job file",
          "[checkpoint][hf][tools][full]") {
  test::TempDir dir;
  // A Qwen3 debug model's weights with titan names: model.name must say qwen3, the default (llama3) would not fit.
  JobConfig config;
  config.model.name = "qwen3";
  config.training.seq_len = 16;
  const auto model = models::build_model(config, 0, {.device = at::kCPU});
  const std::vector<at::Tensor> params = model->unique_parameters();
  const std::vector<std::string> names = parameter_names(*model, params);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (size_t i = 0; i < params.size(); ++i) tensors.emplace_back(names[i], params[i].detach());
  const fs::path weights = dir.path / "qwen3.safetensors", job = dir.path / "job.toml";
  checkpoint::write_safetensors(weights, tensors);
  test::write_file(job,
                   "[model]\nname = \"qwen3\"\nflavor = \"debugmodel\"\n[checkpoint]\nexport_dtype = \"bfloat16\"\n");

  for (const std::vector<std::string>& keys :
       {std::vector<std::string>{"--model.name", "qwen3", "--checkpoint.export_dtype", "bfloat16"},
        std::vector<std::string>{"--job.config_file", job.string()}}) {
    const fs::path hf = dir.path / fmt::format("hf{}", keys.size());
    // A tokenizer folder holding no tokenizer (the test's folder).
    std::vector<std::string> args = {
        "to-hf", "--input", weights.string(), "--output", hf.string(), "--model.hf_assets_path", dir.path.string()};
    args.insert(args.end(), keys.begin(), keys.end());
    const test::ToolRun run = convert(args);
    INFO(run.output);
    REQUIRE(run.code == 0);
    CHECK_THAT(test::read_file(hf / "config.json"), Catch::Contains("Qwen3ForCausalLM"));
    const checkpoint::HfReader reader(hf);
    REQUIRE(!reader.names().empty());
    CHECK(reader.read(reader.names().front()).scalar_type() == at::kBFloat16);
    // No tokenizer in model.hf_assets_path: the export goes without one, saying so.
    CHECK_THAT(run.output, Catch::Contains("carries no tokenizer") && Catch::Contains("--model.hf_assets_path"));
    CHECK(!fs::exists(hf / "tokenizer.json"));
  }

  // The default model (llama3, untied) does not fit these (tied) weights: the error names the keys to set.
  const test::ToolRun wrong =
      convert({"to-hf", "--input", weights.string(), "--output", (dir.path / "llama").string()});
  CHECK(wrong.code == 1);
  CHECK_THAT(wrong.output, Catch::Contains("(llama3 debugmodel does not tie its embeddings)") &&
                               Catch::Contains("--model.name, --model.flavor, or the run's --job.config_file"));

  // The flags the keys replaced are refused, naming the key.
  for (const auto& [flag, key] :
       std::vector<std::pair<std::string, std::string>>{{"--model", "--model.name NAME"},
                                                        {"--flavor", "--model.flavor NAME"},
                                                        {"--dtype", "--checkpoint.export_dtype"},
                                                        {"--tokenizer", "--model.hf_assets_path"}}) {
    const test::ToolRun run =
        convert({"to-hf", "--input", weights.string(), "--output", (dir.path / "x").string(), flag, "a"});
    INFO(run.output);
    CHECK(run.code == 1);
    CHECK_THAT(run.output, Catch::Contains(fmt::format("expected {}", key)) && Catch::Contains("got " + flag));
  }
  const test::ToolRun no_command = convert({"--input", weights.string()});
  CHECK(no_command.code == 1);
  CHECK_THAT(no_command.output, Catch::Contains("expected one command, to-hf, to-peft, from-hf, from-dcp or to-dcp"));
}
