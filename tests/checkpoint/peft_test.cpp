// SPDX-License-Identifier: BSD-3-Clause
// LoRA adapters out of titan (checkpoint/peft.hpp, titan-convert to-peft and to-hf, the Trainer's final HF save):
// PEFT's names for titan's adapters, a PEFT folder that reads back as it was written, merging as W + alpha/rank B A;
// and the oracle: Hugging Face PEFT loads the adapter of a trained titan LoRA run onto transformers' model of its
// base (titan's own HF export of it) and gives titan's logits, as the merged export does in plain transformers.
//
// Tolerance of the oracle, 1e-5 absolute on fp32 logits: titan and transformers compute the same function with other
// kernels (SDPA vs eager softmax, pairwise vs rotate-half RoPE, other GEMM blockings), and the merged model computes
// W + s B A where the others compute W x + s B (A x). fp32's unit roundoff is 6e-8 and a reordered reduction of n
// terms moves its result by about sqrt(n) ulp: 1.7e-6 relative for debugmodel's widest reduction (768 terms). The
// blocks add their outputs to the residual stream and RMSNorm rescales it, so these errors add up over the 6 blocks
// rather than multiply, each scaled by its block's share of the stream (well under 1): about 1e-6 relative at the
// logits, which the test checks to stay within |8| (5.2 measured): some 8e-6 at most, under 1e-5. Measured: 1.4e-6
// (PEFT), 4.1e-6 (merged). The adapters' own contribution is checked to be far above it (> 1e-3; 4.4 measured): a
// misplaced row of B (the RoPE permutation), a wrong scale or a missing adapter moves the logits by that much.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "test_util.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/checkpoint/peft.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/data/tokenizer.hpp"
#include "titan/models/llama3/hf_adapter.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/train/trainer.hpp"
#include "tool_run.hpp"
#include "train/train_test_util.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace peft_test {

using namespace titan;
namespace fs = std::filesystem;
using Named = std::vector<std::pair<std::string, at::Tensor>>;

constexpr double kLogitTolerance = 1e-5;
constexpr double kLogitBound = 8;

llama3::Llama3Args small_args() {
  llama3::Llama3Args args = llama3::flavor("debugmodel");
  args.dim = 64;
  args.n_heads = 4;
  args.n_kv_heads = 2;
  args.n_layers = 2;
  args.vocab_size = 96;
  return args;
}

at::Tensor random(std::vector<int64_t> shape, uint64_t seed) {
  return at::randn(shape, at::make_generator<at::CPUGeneratorImpl>(seed));
}

TEST_CASE("titan's LoRA adapters take PEFT's names, read back as written and merge as W + alpha/rank B A",
          "[checkpoint][lora][peft]") {
  const auto adapter = llama3::hf_adapter(small_args());
  CHECK(checkpoint::peft_name("layers.1.attention.wq.lora_a.weight", *adapter) ==
        "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
  CHECK(checkpoint::peft_name("layers.0.feed_forward.w2.lora_b.weight", *adapter) ==
        "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight");
  CHECK(checkpoint::peft_name("output.lora_b.weight", *adapter) == "base_model.model.lm_head.lora_B.weight");
  CHECK_THROWS_WITH(checkpoint::peft_name("layers.0.attention.wq.weight", *adapter),
                    Catch::Contains("expected a LoRA adapter name"));

  // wq's rows are RoPE-permuted for HF: B's rows move with them, A's columns stay.
  const Named adapters = {{"layers.0.attention.wq.lora_a.weight", random({4, 64}, 1)},
                          {"layers.0.attention.wq.lora_b.weight", random({64, 4}, 2)},
                          {"layers.0.attention.wv.lora_a.weight", random({4, 64}, 3)},
                          {"layers.0.attention.wv.lora_b.weight", random({32, 4}, 4)}};
  test::TempDir dir;
  const nlohmann::json lora = {{"rank", 4}, {"alpha", 8.0}, {"dropout", 0.1}};
  checkpoint::save_peft(dir.path / "peft", adapters, *adapter, {.lora = lora, .base_model = "base"});
  const checkpoint::SafetensorsFile file(dir.path / "peft" / "adapter_model.safetensors");
  CHECK(at::equal(file.read("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"),
                  checkpoint::rope_rows_to_hf(adapters[1].second, 4)));
  CHECK(at::equal(file.read("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), adapters[0].second));
  std::ifstream in(dir.path / "peft" / "adapter_config.json");
  const auto config = nlohmann::json::parse(in);
  CHECK(config.at("peft_type") == "LORA");
  CHECK(config.at("task_type") == "CAUSAL_LM");
  CHECK(config.at("r") == 4);
  CHECK(config.at("lora_alpha") == 8.0);
  CHECK(config.at("lora_dropout") == 0.1);
  CHECK(config.at("base_model_name_or_path") == "base");
  CHECK(config.at("target_modules") ==
        nlohmann::json({"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"}));
  std::vector<std::string> fqns;
  for (const auto& [fqn, _] : adapters) fqns.push_back(fqn);
  const Named back = checkpoint::load_peft(dir.path / "peft", fqns, *adapter);
  for (size_t i = 0; i < adapters.size(); ++i) CHECK(at::equal(back[i].second, adapters[i].second));

  const Named base = {{"layers.0.attention.wq.weight", random({64, 64}, 5)},
                      {"layers.0.attention.wv.weight", random({32, 64}, 6)},
                      {"norm.weight", random({64}, 7)}};
  const Named merged = checkpoint::merge_lora(base, adapters, 2.0);
  CHECK(at::allclose(merged[0].second, base[0].second + 2.0 * at::matmul(adapters[1].second, adapters[0].second)));
  CHECK(at::allclose(merged[1].second, base[1].second + 2.0 * at::matmul(adapters[3].second, adapters[2].second)));
  CHECK(at::equal(merged[2].second, base[2].second));
  CHECK_THROWS_WITH(checkpoint::merge_lora({base[2]}, adapters, 2.0),
                    Catch::Contains("expected the base weight 'layers.0.attention.wq.weight'") &&
                        Catch::Contains("titan-convert to-hf --base"));
}

JobConfig lora_job(const fs::path& dump) {
  JobConfig c = test::tinyshakespeare_job(dump, /*seq_len=*/32, /*local_batch=*/2, /*steps=*/3, /*seed=*/11);
  c.model.converters = {"lora"};
  c.lora = {.rank = 4, .alpha = 16};  // every Linear, the output head too
  c.optimizer.lr = 2e-2;
  c.lr_scheduler.warmup_steps = 1;
  c.checkpoint.enable = true;
  c.metrics.disable_color_printing = true;
  return c;
}

at::Tensor titan_logits(const llama3::Llama3& model, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  return model.forward(tokens).to(at::kFloat);  // (B, S, V)
}

void require_convert(const std::vector<std::string>& args) {
  const test::ToolRun run = test::run_tool("titan-convert", args);
  INFO(run.output);
  REQUIRE(run.code == 0);
}

TEST_CASE("PEFT loads a trained titan LoRA adapter onto titan's HF base and gives titan's logits, as the merge does",
          "[checkpoint][lora][peft][hf][full]") {
  test::TempDir dir;
  Trainer<llama3::Llama3> trainer(lora_job(dir.path / "run"));
  trainer.train();
  const fs::path step = dir.path / "run" / "checkpoint" / "step-3";  // the final save: base and adapters
  const fs::path base = dir.path / "base", peft = dir.path / "peft", merged = dir.path / "merged";
  require_convert({"to-hf", "--input", step.string(), "--output", base.string(), "--adapters", "drop"});
  require_convert({"to-peft", "--input", step.string(), "--output", peft.string(), "--base-model", base.string(),
                   "--model.hf_assets_path", test::test_tokenizer().string()});
  // The adapter carries the run's tokenizer, file for file, as the HF export does.
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    CHECK(test::read_file(peft / file) == test::read_file(test::test_tokenizer() / file));
  require_convert({"to-hf", "--input", step.string(), "--output", merged.string()});

  const at::Tensor tokens = at::randint(trainer.model().vocab_size(), {2, 16},
                                        at::make_generator<at::CPUGeneratorImpl>(3), at::kLong);  // (B, S)
  const fs::path tokens_file = dir.path / "tokens.safetensors";
  checkpoint::write_safetensors(tokens_file, {{"tokens", tokens}});
  const at::Tensor want = titan_logits(trainer.model(), tokens);
  // One Python process: PEFT on the base and the adapter, and transformers on the merged export.
  const fs::path peft_out = dir.path / "peft_logits.safetensors";
  REQUIRE(test::run_python("peft_lora.py",
                           fmt::format("logits \"{}\" \"{}\" \"{}\" \"{}\" \"{}\"", base.string(), peft.string(),
                                       tokens_file.string(), peft_out.string(), merged.string())) == 0);
  const checkpoint::SafetensorsFile peft_logits(peft_out);
  CHECK(want.abs().max().item<double>() < kLogitBound);  // the size the tolerance is argued for
  CHECK((peft_logits.read("base_logits") - want).abs().max().item<double>() > 1e-3);  // the adapters matter
  CHECK((peft_logits.read("logits") - want).abs().max().item<double>() < kLogitTolerance);
  CHECK((peft_logits.read("merged_logits") - want).abs().max().item<double>() < kLogitTolerance);
  // transformers reads the tokenizer from the adapter folder alone, and it is the run's (peft_lora.py's SAMPLE_TEXT).
  const std::vector<int32_t> ids =
      data::load_tokenizer(test::test_tokenizer())->encode("To be, or not to be: that is the question.");
  CHECK(at::equal(peft_logits.read("tokenizer_ids"), at::tensor(std::vector<int64_t>(ids.begin(), ids.end()))));

  // The Trainer's own final HF save writes the same adapter (checkpoint.last_save_in_hf), or the same merged model
  // (lora.merge_adapter).
  for (const bool merge : {false, true}) {
    INFO("merge_adapter " << merge);
    JobConfig c = lora_job(dir.path / (merge ? "merging" : "adapter"));
    c.checkpoint.last_save_in_hf = true;
    c.lora.merge_adapter = merge;
    Trainer<llama3::Llama3>(c).train();
    const fs::path out = dir.path / (merge ? "merging" : "adapter") / "checkpoint" / "step-3";
    const fs::path file = merge ? out / "model.safetensors" : out / "adapter_model.safetensors";
    const fs::path expected = merge ? merged / "model.safetensors" : peft / "adapter_model.safetensors";
    CHECK(test::read_file(out / "tokenizer.json") == test::read_file(test::test_tokenizer() / "tokenizer.json"));
    const checkpoint::SafetensorsFile got(file), want_file(expected);
    REQUIRE(got.entries().size() == want_file.entries().size());
    for (const auto& [name, _] : want_file.entries()) {
      INFO(name);
      CHECK(at::equal(got.read(name), want_file.read(name)));
    }
  }
}

}  // namespace peft_test
