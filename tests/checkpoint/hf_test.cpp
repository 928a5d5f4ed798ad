// SPDX-License-Identifier: BSD-3-Clause
// Hugging Face round trips against transformers' LlamaForCausalLM (the oracle, fp32, eager
// attention): a random HF Llama (tied and untied, single file and sharded) loads into titan with
// the same logits, directly and through titan-convert; a trained titan model exported at the end of
// training gives transformers titan's logits.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "checkpoint/convert_round_trip.hpp"
#include "dist/subprocess.hpp"
#include "test_util.hpp"
#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/models/llama3/hf_adapter.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

using namespace titan;
namespace fs = std::filesystem;

namespace {

// transformers and titan compute the same fp32 function with different kernels (eager softmax vs
// SDPA, rotate-half vs pairwise RoPE, other matmul blockings): agreement to ~1e-6 of logits of
// size ~1-10; 1e-4 absolute leaves margin and still catches any misplaced row (errors of ~0.1+).
constexpr double kLogitTolerance = 1e-4;

checkpoint::State model_state(llama3::Llama3& model) {
  checkpoint::State state;
  for (const auto& item : model.named_parameters()) {
    state.tensors.push_back(checkpoint::state_tensor("model." + item.key(), item.value(), nullptr));
  }
  return state;
}

at::Tensor titan_logits(const llama3::Llama3& model, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  return model.forward(tokens).to(at::kFloat);  // (B, S, V)
}

}  // namespace

TEST_CASE("an HF Llama saved by transformers loads into titan with the same logits", "[checkpoint][hf][full]") {
  test::TempDir dir;
  // Both models from one Python process (transformers is imported once): untied and sharded, tied in one file.
  REQUIRE(test::run_python(
              "hf_llama.py",
              fmt::format("make \"{}\" \"{}\" --sharded -- \"{}\" \"{}\" --tied", (dir.path / "untied" / "hf").string(),
                          (dir.path / "untied" / "oracle.safetensors").string(), (dir.path / "tied" / "hf").string(),
                          (dir.path / "tied" / "oracle.safetensors").string())) == 0);
  for (const bool tied : {false, true}) {
    const bool sharded = !tied;
    INFO("tied " << tied << ", sharded " << sharded);
    const fs::path work = dir.path / (tied ? "tied" : "untied"), hf = work / "hf";
    CHECK(fs::exists(hf / "model.safetensors.index.json") == sharded);
    const checkpoint::SafetensorsFile expected(work / "oracle.safetensors");
    const at::Tensor tokens = expected.read("tokens");  // (B, S)

    const checkpoint::HfReader reader(hf);
    const llama3::Llama3Args args = llama3::args_from_hf_config(reader.config());
    CHECK(args.tie_word_embeddings == tied);
    llama3::Llama3 model(args, tokens.size(1), at::TensorOptions());
    checkpoint::State state = model_state(model);
    checkpoint::load_hf(hf, state, *model.hf_adapter());
    const at::Tensor logits = titan_logits(model, tokens);
    CHECK((logits - expected.read("logits")).abs().max().item<double>() < kLogitTolerance);

    // titan-convert to-hf gives transformers the same model back; from-hf gives the same weights.
    test::check_convert_round_trip(hf, work, sharded ? 30000 : 100000000);
    llama3::Llama3 again(args, tokens.size(1), at::TensorOptions());
    checkpoint::State again_state = model_state(again);
    checkpoint::load_safetensors(checkpoint::SafetensorsFile(work / "converted.safetensors"), again_state);
    CHECK(at::equal(titan_logits(again, tokens), logits));
  }
}

TEST_CASE("a trained titan model exported to HF at the end of training gives transformers its logits",
          "[checkpoint][hf][train][full]") {
  test::TempDir dir;
  JobConfig c = test::tinyshakespeare_job(dir.path, /*seq_len=*/32, /*local_batch=*/2, /*steps=*/3, /*seed=*/11);
  c.checkpoint.enable = true;
  c.checkpoint.last_save_in_hf = true;
  c.metrics.disable_color_printing = true;
  Trainer<llama3::Llama3> trainer(c);
  trainer.train();
  const fs::path hf = dir.path / "checkpoint" / "step-3";
  REQUIRE(fs::exists(hf / "config.json"));
  REQUIRE(fs::exists(hf / "model.safetensors"));
  // It carries the run's tokenizer (model.hf_assets_path), file for file.
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    CHECK(test::read_file(hf / file) == test::read_file(test::test_tokenizer() / file));

  const at::Tensor tokens =
      at::randint(trainer.model().vocab_size(), {2, 16}, at::make_generator<at::CPUGeneratorImpl>(3),
                  at::kLong);  // (B, S)
  const fs::path tokens_file = dir.path / "tokens.safetensors", out = dir.path / "hf_logits.safetensors";
  checkpoint::write_safetensors(tokens_file, {{"tokens", tokens}});
  REQUIRE(test::run_python("hf_llama.py", fmt::format("logits \"{}\" \"{}\" \"{}\"", hf.string(), tokens_file.string(),
                                                      out.string())) == 0);
  const at::Tensor want = titan_logits(trainer.model(), tokens);
  const at::Tensor got = checkpoint::SafetensorsFile(out).read("logits");
  CHECK((got - want).abs().max().item<double>() < kLogitTolerance);

  // The export is a starting point: a new run with it as initial_load_path holds the same weights.
  JobConfig next =
      test::tinyshakespeare_job(dir.path / "next", /*seq_len=*/32, /*local_batch=*/2, /*steps=*/1, /*seed=*/12);
  next.checkpoint.initial_load_path = hf.string();
  next.checkpoint.initial_load_in_hf = true;
  Trainer<llama3::Llama3> from_hf(next);
  CHECK(at::equal(titan_logits(from_hf.model(), tokens), want));
}
