// SPDX-License-Identifier: BSD-3-Clause
// QLoRA through the Trainer (lora.quantize_base): the base loads dense from checkpoint.initial_load_path, goes to NF4
// and is freed; checkpoints hold the adapters alone, titan-convert merges them into the dequantised NF4 bases, and a
// resume quantises the same base again and repeats the straight run's steps bitwise. The settings QLoRA refuses fail
// naming their key.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/quant/nf4.hpp"
#include "titan/train/trainer.hpp"
#include "tool_run.hpp"
#include "train/train_test_util.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace qlora_trainer_test {

using namespace titan;
using Catch::Contains;
namespace fs = std::filesystem;

TEST_CASE("a QLoRA run quantises the loaded base and resumes from an adapter-only checkpoint bitwise",
          "[train][lora][qlora][checkpoint][full]") {
  test::TempDir dir;
  Trainer<llama3::Llama3>(test::seed_checkpoint_job(dir.path / "seed", /*seed=*/9)).train();
  const fs::path base = test::seed_checkpoint_file(dir.path / "seed");

  JobConfig c = test::tinyshakespeare_job(dir.path / "run", /*seq_len=*/32, /*local_batch=*/2, 4, /*seed=*/5);
  c.model.converters = {"lora"};
  c.lora = {.rank = 4,
            .alpha = 8,
            .target_modules = {"attention.wq", "feed_forward.w2"},
            .save_adapter_only = true,
            .quantize_base = true};
  c.optimizer.lr = 1e-2;
  c.lr_scheduler.warmup_steps = 1;
  c.checkpoint.enable = true;
  c.checkpoint.interval = 2;
  c.checkpoint.initial_load_path = base.string();
  Trainer<llama3::Llama3> straight(c);
  straight.train();
  const std::vector<double> want = straight.core().loss_history();
  const RankModel<llama3::Llama3>& model = straight.rank_model();
  int64_t freed = 0;
  for (size_t i = 0; i < model.frozen_parameters().size(); ++i) {
    const std::string& name = model.frozen_parameter_names()[i];
    const bool adapted = name.ends_with("attention.wq.weight") || name.ends_with("feed_forward.w2.weight");
    INFO(name);
    CHECK((model.frozen_parameters()[i].numel() == 0) == adapted);
    freed += adapted ? 1 : 0;
  }
  CHECK(freed == 2 * 6);
  // The checkpoint holds no base, and records how the adapters' base was stored (titan-convert merges into it).
  std::ifstream in(dir.path / "run" / "checkpoint" / "step-2" / "index.json");
  const auto index = nlohmann::json::parse(in);
  for (const auto& [key, _] : index.at("tensors").items()) CHECK_FALSE(key.starts_with("model."));
  CHECK(index.at("values").at("lora").at("quantize_base") == true);
  CHECK(index.at("values").at("lora").at("nf4_dtype") == "float32");
  REQUIRE(want.size() == 4);

  // titan-convert merges the adapters into the dequantised NF4 bases: W' = dequant(to_nf4(W)) + alpha/rank B A (fp32).
  const fs::path step4 = dir.path / "run" / "checkpoint" / "step-4", out = dir.path / "out";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"to-hf", "--input", step4.string(), "--base", base.string(), "--output",
                                 (out / "merged").string()},
        std::vector<std::string>{"to-peft", "--input", step4.string(), "--output", (out / "peft").string()}}) {
    const test::ToolRun run = test::run_tool("titan-convert", args);
    INFO(run.output);
    REQUIRE(run.code == 0);
  }
  const checkpoint::SafetensorsFile merged(out / "merged" / "model.safetensors");
  const checkpoint::SafetensorsFile peft(out / "peft" / "adapter_model.safetensors");
  const std::string proj = "model.layers.1.mlp.down_proj";  // w2: no RoPE permutation between titan and HF
  const at::Tensor w = checkpoint::SafetensorsFile(base).read("layers.1.feed_forward.w2.weight");  // (D, F)
  const at::Tensor delta = at::matmul(peft.read("base_model.model." + proj + ".lora_B.weight"),
                                      peft.read("base_model.model." + proj + ".lora_A.weight"));  // (D, F)
  CHECK(at::equal(merged.read(proj + ".weight"), quant::dequantize(quant::to_nf4(w)) + delta * 2.0));
  CHECK_FALSE(at::equal(merged.read(proj + ".weight"), w + delta * 2.0));  // not the dense base

  c.checkpoint.load_step = 2;
  Trainer<llama3::Llama3> resumed(c);
  resumed.train();
  const std::vector<double> got = resumed.core().loss_history();
  REQUIRE(got.size() == 2);
  CHECK(got[0] == want[2]);  // deterministic CPU fp32: the same NF4 base, adapters, optimizer state and data
  CHECK(got[1] == want[3]);
}

JobConfig qlora_args(std::vector<std::string> args) {
  args.insert(args.begin(), {"prog", "--model.converters", "lora", "--lora.quantize_base", "true"});
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parse_args(static_cast<int>(argv.size()), argv.data());
}

TEST_CASE("config: lora.quantize_base refuses float8, parallel layouts and full checkpoints, naming the key",
          "[core][config][lora][qlora]") {
  CHECK_NOTHROW(qlora_args({}));
  CHECK_THROWS_WITH(qlora_args({"--model.converters", "lora,float8"}), Contains("model.converters"));
  CHECK_THROWS_WITH(qlora_args({"--parallelism.tensor_parallel_degree", "2"}),
                    Contains("parallelism.tensor_parallel_degree") && Contains("one device"));
  CHECK_THROWS_WITH(qlora_args({"--parallelism.data_parallel_shard_degree", "2"}),
                    Contains("parallelism.data_parallel_shard_degree"));
  CHECK_THROWS_WITH(qlora_args({"--checkpoint.enable", "true", "--debug.seed", "1"}),
                    Contains("lora.save_adapter_only") && Contains("quantize_base"));
  CHECK_NOTHROW(qlora_args({"--checkpoint.enable", "true", "--debug.seed", "1", "--lora.save_adapter_only", "true"}));
  CHECK_THROWS_WITH(qlora_args({"--lora.merge_adapter", "true"}), Contains("merge_adapter"));
  CHECK_THROWS_WITH(qlora_args({"--model.converters", "float8"}), Contains("lora.quantize_base"));
}

}  // namespace qlora_trainer_test
