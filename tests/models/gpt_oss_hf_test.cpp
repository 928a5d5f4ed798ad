// SPDX-License-Identifier: BSD-3-Clause
// gpt-oss <-> Hugging Face against transformers' GptOssForCausalLM (the oracle, fp32, eager attention), on
// small random models with sliding and full blocks (a window of 5 over sequences of 20), YaRN with
// gpt-oss's constants, non-zero sinks and biases, and a SwiGLU clamp of 1 that many values pass: a model
// transformers made loads into titan with its logits and exports back to the same tensors bitwise; a model
// titan made (its own random weights) exported to HF gives transformers titan's logits; the debugmodel
// trained 3 steps by titan's Trainer and saved in HF format (checkpoint.last_save_in_hf) does too.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "checkpoint/convert_round_trip.hpp"
#include "test_util.hpp"
#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/models/gpt_oss/hf_adapter.hpp"
#include "titan/models/gpt_oss/model.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace gpt_oss_hf_test {

using namespace titan;
namespace fs = std::filesystem;

namespace {

// transformers and titan compute the same fp32 function with different kernels (eager softmax with the sink
// column vs the flash kernel merged with the sink, rotate-half vs pairwise RoPE, a per-expert loop vs the
// grouped GEMM, softmax over the top-k logits vs over all experts renormalised): measured agreement ~1e-6
// on logits of std ~1. 1e-5 still catches a misplaced row, a swapped gate/up column, a wrong window edge or
// a sink on the wrong head (errors of 1e-2 and more).
constexpr double kLogitTolerance = 1e-5;

// The oracle's shape (tests/oracles/hf_gpt_oss.py make).
gpt_oss::GptOssArgs oracle_args() {
  gpt_oss::GptOssArgs a{.dim = 64,
                        .n_layers = 3,
                        .n_heads = 4,
                        .n_kv_heads = 2,
                        .head_dim = 16,
                        .vocab_size = 96,
                        .moe_inter_dim = 24,
                        .sliding_window = 5,
                        .moe = gpt_oss::gpt_oss_moe(6)};
  a.moe.top_k = 3;
  a.moe.swiglu_limit = 1.0;
  return a;
}

checkpoint::State model_state(gpt_oss::GptOss& model) {
  checkpoint::State state;
  for (const auto& item : model.named_parameters()) {
    state.tensors.push_back(checkpoint::state_tensor("model." + item.key(), item.value(), nullptr));
  }
  return state;
}

std::vector<std::pair<std::string, at::Tensor>> whole_tensors(const gpt_oss::GptOss& model) {
  std::vector<std::pair<std::string, at::Tensor>> whole;
  for (const auto& item : model.named_parameters()) whole.emplace_back(item.key(), item.value());
  return whole;
}

at::Tensor titan_logits(const gpt_oss::GptOss& model, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  return model.forward(tokens);  // (B, S, V)
}

}  // namespace

TEST_CASE("an HF gpt-oss saved by transformers loads into titan with its logits and exports back bitwise",
          "[checkpoint][hf][gpt_oss][full]") {
  test::TempDir dir;
  const fs::path hf = dir.path / "hf", oracle = dir.path / "oracle.safetensors";
  REQUIRE(test::run_python("hf_gpt_oss.py", fmt::format("make \"{}\" \"{}\"", hf.string(), oracle.string())) == 0);
  const checkpoint::SafetensorsFile expected(oracle);
  const at::Tensor tokens = expected.read("tokens");  // (B, S)

  const checkpoint::HfReader reader(hf);
  const gpt_oss::GptOssArgs args = gpt_oss::args_from_hf_config(reader.config());
  CHECK(args.sliding_window == 5);
  CHECK(args.moe.num_experts == 6);
  CHECK(args.moe.top_k == 3);
  CHECK(args.moe.swiglu_limit == 1.0);
  CHECK(args.rope_factor == 32.0);
  CHECK_FALSE(args.rope_truncate);            // gpt-oss's YaRN keeps the ramp's ends fractional
  CHECK(args.moe.load_balance_coeff == 0.0);  // an HF model has no expert bias
  gpt_oss::GptOss model(args, tokens.size(1), at::TensorOptions());
  checkpoint::State state = model_state(model);
  checkpoint::load_hf(hf, state, *model.hf_adapter());
  const double diff = (titan_logits(model, tokens) - expected.read("logits")).abs().max().item<double>();
  INFO("max abs logit difference " << diff);
  CHECK(diff < kLogitTolerance);

  // Export: the same HF tensors bitwise (gate_up_proj re-interleaved), and a config read back the same.
  const fs::path back = dir.path / "back";
  checkpoint::save_hf(back, whole_tensors(model), *model.hf_adapter(), at::kFloat);
  const checkpoint::HfReader original(hf), round_trip(back);
  CHECK(round_trip.names() == original.names());
  for (const auto& name : original.names()) {
    INFO(name);
    CHECK(at::equal(round_trip.read(name), original.read(name)));
  }
  const gpt_oss::GptOssArgs again = gpt_oss::args_from_hf_config(round_trip.config());
  CHECK(again.n_layers == args.n_layers);
  CHECK(again.head_dim == args.head_dim);
  CHECK(again.sliding_window == args.sliding_window);
  CHECK(again.moe.swiglu_limit == args.moe.swiglu_limit);
  CHECK(again.original_seq_len == args.original_seq_len);
  test::check_convert_round_trip(hf, dir.path);  // the same through titan-convert from-hf and to-hf --like
}

TEST_CASE("a gpt-oss made by titan exports to HF and transformers gives its logits",
          "[checkpoint][hf][gpt_oss][full]") {
  test::TempDir dir;
  gpt_oss::GptOss model(oracle_args(), 20, at::TensorOptions());
  {
    // titan's own draws, at the oracle's scale so every part of the function shows in the logits.
    at::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
    for (auto& item : model.named_parameters()) {
      at::Tensor& p = item.value();
      const std::string& name = item.key();
      const at::Tensor noise = at::randn(p.sizes(), gen);
      if (name.ends_with("norm.weight")) {
        p.copy_(1.0 + 0.3 * noise);
      } else if (p.dim() == 1 || name.ends_with("_bias")) {
        p.copy_(0.5 * noise);
      } else {
        p.copy_(0.15 * noise);
      }
    }
  }
  const fs::path hf = dir.path / "hf";
  checkpoint::save_hf(hf, whole_tensors(model), *model.hf_adapter(), at::kFloat);
  const at::Tensor tokens = at::randint(96, {2, 20}, at::make_generator<at::CPUGeneratorImpl>(3), at::kLong);
  const fs::path tokens_file = dir.path / "tokens.safetensors", out = dir.path / "logits.safetensors";
  checkpoint::write_safetensors(tokens_file, {{"tokens", tokens}});
  REQUIRE(test::run_python("hf_gpt_oss.py", fmt::format("logits \"{}\" \"{}\" \"{}\"", hf.string(),
                                                        tokens_file.string(), out.string())) == 0);
  const at::Tensor want = checkpoint::SafetensorsFile(out).read("logits");  // (B, S, V)
  const at::Tensor got = titan_logits(model, tokens);
  INFO("logit std " << got.std().item<double>());
  const double diff = (got - want).abs().max().item<double>();
  INFO("max abs logit difference " << diff);
  CHECK(diff < kLogitTolerance);
}

namespace {

// The debugmodel without the expert bias: HF's gpt-oss routes without one, so a model trained with the bias
// moving exports weights that transformers routes differently (see docs/gpt_oss.md).
struct UnbiasedDebugGptOss : gpt_oss::GptOss {
  using gpt_oss::GptOss::GptOss;
  static std::shared_ptr<UnbiasedDebugGptOss> build(const gpt_oss::GptOssArgs& args, const ModelBuild& where) {
    return std::make_shared<UnbiasedDebugGptOss>(args, args.max_seq_len, at::TensorOptions().device(where.device),
                                                 where.modules);
  }
};

gpt_oss::GptOssArgs unbiased_debug_args(int64_t seq_len) {
  gpt_oss::GptOssArgs args = gpt_oss::flavor("debugmodel");
  args.moe.load_balance_coeff = 0.0;
  args.max_seq_len = seq_len;
  return args;
}

}  // namespace

TEST_CASE("a gpt-oss debugmodel trained by titan's Trainer exports to HF and transformers gives its logits",
          "[checkpoint][hf][gpt_oss][train][full]") {
  test::TempDir dir;
  JobConfig c = test::tinyshakespeare_job(dir.path, /*seq_len=*/32, /*local_batch=*/2, /*steps=*/3, /*seed=*/11);
  c.model.name = "gpt_oss";
  c.checkpoint.enable = true;
  c.checkpoint.last_save_in_hf = true;
  c.metrics.disable_color_printing = true;
  Trainer<UnbiasedDebugGptOss> trainer(c, unbiased_debug_args(c.training.seq_len));
  trainer.train();
  const fs::path hf = dir.path / "checkpoint" / "step-3";
  REQUIRE(fs::exists(hf / "config.json"));
  const at::Tensor tokens = at::randint(trainer.model().vocab_size(), {2, 16},
                                        at::make_generator<at::CPUGeneratorImpl>(3), at::kLong);  // (B, S)
  const fs::path tokens_file = dir.path / "tokens.safetensors", out = dir.path / "logits.safetensors";
  checkpoint::write_safetensors(tokens_file, {{"tokens", tokens}});
  REQUIRE(test::run_python("hf_gpt_oss.py", fmt::format("logits \"{}\" \"{}\" \"{}\"", hf.string(),
                                                        tokens_file.string(), out.string())) == 0);
  const double diff = (checkpoint::SafetensorsFile(out).read("logits") - titan_logits(trainer.model(), tokens))
                          .abs()
                          .max()
                          .item<double>();
  INFO("max abs logit difference " << diff);
  CHECK(diff < kLogitTolerance);
}

}  // namespace gpt_oss_hf_test
