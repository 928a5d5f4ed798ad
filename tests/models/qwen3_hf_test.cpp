// SPDX-License-Identifier: BSD-3-Clause
// Qwen3 <-> Hugging Face against transformers' Qwen3ForCausalLM and Qwen3MoeForCausalLM (the oracle,
// fp32, eager attention): a random small HF model loads into titan with the same logits and exports
// back to the same tensors; a debug model trained by titan's Trainer exports and transformers
// reproduces titan's loss and logits.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "dist/subprocess.hpp"
#include "models/hf_export_util.hpp"
#include "test_util.hpp"
#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/models/model_spec.hpp"
#include "titan/models/qwen3/hf_adapter.hpp"
#include "titan/models/qwen3/model.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

using namespace titan;
namespace fs = std::filesystem;

namespace {

// transformers and titan compute the same fp32 function with different kernels (eager softmax vs
// SDPA, rotate-half vs pairwise RoPE, a per-expert loop vs grouped GEMM): agreement to ~1e-6 on
// logits of size ~1-10; 1e-4 absolute leaves margin and still catches a misplaced row, a wrong
// expert or a wrong routing weight (errors of ~0.1+).
constexpr double kLogitTolerance = 1e-4;

checkpoint::State model_state(qwen3::Qwen3& model) {
  checkpoint::State state;
  for (const auto& item : model.named_parameters()) {
    state.tensors.push_back(checkpoint::state_tensor("model." + item.key(), item.value(), nullptr));
  }
  return state;
}

at::Tensor titan_logits(const qwen3::Qwen3& model, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  return model.forward(tokens).to(at::kFloat);  // (B, S, V)
}

// Loads a transformers-made model into titan, compares logits, exports it back and compares every
// HF tensor bitwise.
void check_import_export(bool moe, bool tied) {
  test::TempDir dir;
  const fs::path hf = dir.path / "hf", oracle = dir.path / "oracle.safetensors";
  REQUIRE(test::run_python("qwen3_oracle.py", fmt::format("make \"{}\" \"{}\"{}{}", hf.string(), oracle.string(),
                                                          moe ? " --moe" : "", tied ? " --tied" : "")) == 0);
  const checkpoint::SafetensorsFile expected(oracle);
  const at::Tensor tokens = expected.read("tokens");  // (B, S)

  const checkpoint::HfReader reader(hf);
  const qwen3::Qwen3Args args = qwen3::args_from_hf_config(reader.config());
  CHECK(args.moe_enabled == moe);
  CHECK(args.tie_word_embeddings == tied);
  CHECK(args.head_dim * args.n_heads != args.dim);
  qwen3::Qwen3 model(args, tokens.size(1), at::TensorOptions());
  if (moe) {
    CHECK(model.moe_layers().size() == 2);  // layer 1 is in mlp_only_layers
    CHECK(model.layers[1]->feed_forward != nullptr);
    // A per-expert loop would be exact too; the grouped GEMM is what training runs.
    CHECK(model.layers[0]->moe->experts->use_grouped_mm);
  }
  checkpoint::State state = model_state(model);
  checkpoint::load_hf(hf, state, *model.hf_adapter());
  const at::Tensor logits = titan_logits(model, tokens);
  CHECK((logits - expected.read("logits")).abs().max().item<double>() < kLogitTolerance);

  // Export: the same HF tensors, bitwise, and a config transformers reads back to the same arguments.
  const fs::path back = dir.path / "back";
  std::vector<std::pair<std::string, at::Tensor>> whole;
  for (const auto& item : model.named_parameters()) whole.emplace_back(item.key(), item.value());
  checkpoint::save_hf(back, whole, *model.hf_adapter(), at::kFloat);
  const checkpoint::HfReader original(hf), round_trip(back);
  CHECK(round_trip.names() == original.names());
  for (const auto& name : original.names()) {
    INFO(name);
    CHECK(at::equal(round_trip.read(name), original.read(name)));
  }
  const qwen3::Qwen3Args again = qwen3::args_from_hf_config(round_trip.config());
  CHECK(again.n_layers == args.n_layers);
  CHECK(again.head_dim == args.head_dim);
  CHECK(again.moe.top_k == args.moe.top_k);
  CHECK(again.mlp_only_layers == args.mlp_only_layers);
  CHECK(again.moe.route_norm == args.moe.route_norm);
}

}  // namespace

TEST_CASE("an HF Qwen3-MoE saved by transformers loads into titan with the same logits and exports back",
          "[checkpoint][hf][qwen3][full]") {
  check_import_export(/*moe=*/true, /*tied=*/false);
}

TEST_CASE("an HF Qwen3 with tied embeddings loads into titan with the same logits and exports back",
          "[checkpoint][hf][qwen3][full]") {
  check_import_export(/*moe=*/false, /*tied=*/true);
}

TEST_CASE("a qwen3 debugmodel trained by titan exports to HF and transformers reproduces its loss",
          "[checkpoint][hf][qwen3][train][full]") {
  test::TempDir dir;
  const test::TrainedExport run = test::train_and_read_back(dir.path, "qwen3", "qwen3_oracle.py");
  const checkpoint::SafetensorsFile got(run.oracle_out);
  CHECK((got.read("logits") - run.logits).abs().max().item<double>() < kLogitTolerance);
  // The mean of the same per-token losses: within the logits' tolerance.
  CHECK(got.read("loss").item<double>() == Approx(run.loss).margin(kLogitTolerance));
}

TEST_CASE("titan-convert to-hf turns a trained qwen3 MoE checkpoint into a folder transformers loads",
          "[checkpoint][hf][qwen3][convert][full]") {
  // A full checkpoint of an MoE model holds the trained expert biases ("moe.<fqn>"), which HF Qwen3-MoE has no
  // tensor for: the conversion leaves them out instead of failing on them. The model is debugmodel_moe cut to 2
  // blocks of 4 experts (the flavor's 64 experts are 300M parameters): a family registered for the test, trained
  // by Trainer<models::Decoder>; titan-convert, another process, gets the shapes --like titan's own HF export.
  models::register_model(
      {.name = "qwen3_tiny_moe",
       .flavors = [] { return std::vector<std::string>{"debugmodel_moe"}; },
       .build = [](const models::DecoderArgs& job, const ModelBuild& where) -> std::shared_ptr<models::Decoder> {
         qwen3::Qwen3Args args = qwen3::flavor("debugmodel_moe");
         args.n_layers = 2;
         args.moe.num_experts = 4;
         args.moe.top_k = 2;
         args.moe_inter_dim = 64;
         if (job.vocab_size > 0) args.vocab_size = job.vocab_size;
         args.max_seq_len = job.max_seq_len;
         return qwen3::Qwen3::build(args, where);
       }});
  test::TempDir dir;
  JobConfig c = test::tinyshakespeare_job(dir.path, /*seq_len=*/32, /*local_batch=*/2, /*steps=*/2, /*seed=*/11);
  c.model.name = "qwen3_tiny_moe";
  c.model.flavor = "debugmodel_moe";
  c.checkpoint.enable = true;
  c.checkpoint.last_save_model_only = false;
  c.metrics.disable_color_printing = true;
  Trainer<models::Decoder> trainer(c);
  trainer.train();
  const fs::path step = dir.path / "checkpoint" / "step-2", like = dir.path / "like", hf = dir.path / "hf";
  REQUIRE_THAT(test::read_file(step / "index.json"), Catch::Contains("moe.layers.0.moe.expert_bias"));
  std::vector<std::pair<std::string, at::Tensor>> shapes;
  for (const auto& item : trainer.model().named_parameters()) shapes.emplace_back(item.key(), item.value());
  checkpoint::save_hf(like, shapes, *trainer.model().hf_adapter(), at::kFloat);
  test::Subprocess convert({(test::binary_dir() / "bin" / "titan-convert").string(), "to-hf", "--input", step.string(),
                            "--output", hf.string(), "--like", like.string()});
  const auto status = convert.wait(120);
  INFO(convert.output());
  REQUIRE(status);
  REQUIRE(test::exit_code(*status) == 0);
  CHECK_THAT(test::read_file(hf / "config.json"), Catch::Contains("Qwen3MoeForCausalLM"));
  const at::Tensor tokens =
      at::randint(trainer.model().vocab_size(), {1, 9}, at::make_generator<at::CPUGeneratorImpl>(3),
                  at::kLong);  // (B, S+1)
  const fs::path tokens_file = dir.path / "tokens.safetensors", out = dir.path / "hf_loss.safetensors";
  checkpoint::write_safetensors(tokens_file, {{"tokens", tokens}});
  REQUIRE(test::run_python("qwen3_oracle.py", fmt::format("loss \"{}\" \"{}\" \"{}\"", hf.string(),
                                                          tokens_file.string(), out.string())) == 0);
  // transformers computes the trained model without its expert biases: titan's logits with them zeroed.
  at::NoGradGuard no_grad;
  for (auto& item : trainer.model().named_buffers()) {
    if (item.key().ends_with(".expert_bias")) item.value().zero_();
  }
  const at::Tensor logits = trainer.model().forward(tokens.narrow(1, 0, 8)).to(at::kFloat);  // (B, S, V)
  CHECK((checkpoint::SafetensorsFile(out).read("logits") - logits).abs().max().item<double>() < kLogitTolerance);
}
