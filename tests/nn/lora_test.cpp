// SPDX-License-Identifier: BSD-3-Clause
// LoRA as a model converter (nn/lora.hpp): which Linears it adapts (torchtitan's names, FQN patterns; MoE routers and
// routed experts never), what it freezes, that a converted model starts as its base and then adds
// alpha / rank * B A x, that float8 leaves the adapters in high precision, and the errors of bad settings, each
// naming its lora.* key (from the converter and from the config).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "models/small_models.hpp"
#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/float8/converter.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/models/qwen3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/layers.hpp"
#include "titan/nn/lora.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace lora_test {

using namespace titan;
using Catch::Contains;

std::vector<std::string> trainable_names(const torch::nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad()) out.push_back(item.key());
  }
  return out;
}

at::Tensor tokens_of(int64_t vocab) {
  return at::randint(vocab, {2, 8}, at::make_generator<at::CPUGeneratorImpl>(7), at::kLong);  // (B, S)
}

JobConfig parse(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parse_args(static_cast<int>(argv.size()), argv.data());
}

TEST_CASE("add_lora adapts the Linears its FQN patterns name, under torchtitan's names, and freezes the rest",
          "[nn][lora]") {
  llama3::Llama3 model(test::small_llama3(), 8, at::TensorOptions());
  const nn::LoraConversion report =
      nn::add_lora(model, {.rank = 4, .alpha = 8, .target_modules = {"wq", "layers.1.feed_forward.*", "output"}});
  CHECK(report.adapted == std::vector<std::string>{"layers.0.attention.wq", "layers.1.attention.wq",
                                                   "layers.1.feed_forward.w1", "layers.1.feed_forward.w2",
                                                   "layers.1.feed_forward.w3", "output"});
  CHECK(report.linears == 2 * 7 + 1);
  std::vector<std::string> want;
  for (const std::string& path : report.adapted) {
    want.push_back(path + ".lora_a.weight");
    want.push_back(path + ".lora_b.weight");
  }
  std::vector<std::string> got = trainable_names(model);
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  CHECK(got == want);
  const auto params = model.named_parameters(/*recurse=*/true);
  const at::Tensor& w2 = params["layers.1.feed_forward.w2.weight"];                                   // (D, F)
  CHECK(params["layers.1.feed_forward.w2.lora_a.weight"].sizes() == at::IntArrayRef{4, w2.size(1)});  // (rank, in)
  CHECK(params["layers.1.feed_forward.w2.lora_b.weight"].sizes() == at::IntArrayRef{w2.size(0), 4});  // (out, rank)
  CHECK(params["output.lora_b.weight"].sizes() == at::IntArrayRef{128, 4});
  int64_t frozen = 0, trained = 0;
  for (const auto& item : params) (item.value().requires_grad() ? trained : frozen) += item.value().numel();
  CHECK(report.frozen_params == frozen);
  CHECK(report.adapter_params == trained);
  CHECK(trained == 4 * (2 * 64 + 2 * 64 + 3 * (64 + w2.size(1)) + 64 + 128));
  // PEFT's matching: a bare name matches the last segment, a dotted suffix or a '*' within one name.
  CHECK(nn::lora_target_matches("attention.wq", "layers.3.attention.wq"));
  CHECK_FALSE(nn::lora_target_matches("tention.wq", "layers.3.attention.wq"));
  CHECK(nn::lora_target_matches("layers.*.feed_forward.w2", "layers.12.feed_forward.w2"));
  CHECK_FALSE(nn::lora_target_matches("layers.*.w2", "layers.12.feed_forward.w2"));
}

TEST_CASE("a converted model starts as its base, then adds alpha / rank * B A x to each adapted Linear", "[nn][lora]") {
  nn::manual_init_seed(3);
  llama3::Llama3 model(test::small_llama3(), 8, at::TensorOptions());
  model.init_weights();
  const at::Tensor tokens = tokens_of(128);
  at::NoGradGuard no_grad;
  const at::Tensor base = model.forward(tokens);  // (B, S, V)
  nn::add_lora(model, {.rank = 4, .alpha = 8});
  nn::init_lora(model);
  CHECK(at::equal(model.forward(tokens), base));  // B = 0
  const auto params = model.named_parameters(/*recurse=*/true);
  const at::Tensor a = params["layers.0.attention.wq.lora_a.weight"];  // (4, 64)
  // torchtitan's Kaiming-uniform init: U(-1/sqrt(in), 1/sqrt(in)), drawn by name.
  CHECK(a.abs().max().item<double>() <= 1.0 / 8.0);
  CHECK(a.abs().max().item<double>() > 0.1);
  at::Tensor b = params["layers.0.attention.wq.lora_b.weight"];  // (64, 4)
  CHECK(b.abs().max().item<double>() == 0);
  b.normal_(0, 0.1, at::make_generator<at::CPUGeneratorImpl>(1));
  auto* wq = dynamic_cast<nn::Linear*>(model.named_modules("", /*include_self=*/false)["layers.0.attention.wq"].get());
  REQUIRE(wq != nullptr);
  const at::Tensor x = at::randn({3, 64}, at::make_generator<at::CPUGeneratorImpl>(2));  // (T, D)
  const at::Tensor want = at::matmul(x, wq->weight.t()) + at::matmul(at::matmul(x, a.t()), b.t()) * 2.0;
  CHECK(at::allclose(wq->forward(x), want, 1e-6, 1e-6));
  CHECK_FALSE(at::allclose(model.forward(tokens), base));
}

TEST_CASE("MoE models get adapters on attention and dense layers, none on routers or routed experts",
          "[nn][lora][moe]") {
  qwen3::Qwen3 model(test::small_qwen3_moe(), 8, at::TensorOptions());
  const nn::LoraConversion report = nn::add_lora(model, {.rank = 2});
  for (const std::string& path : report.adapted) {
    INFO(path);
    CHECK(path.find(".moe.") == std::string::npos);
  }
  CHECK(std::count_if(report.adapted.begin(), report.adapted.end(),
                      [](const std::string& p) { return p.find(".attention.") != std::string::npos; }) == 3 * 4);
  CHECK(std::count_if(report.adapted.begin(), report.adapted.end(),
                      [](const std::string& p) { return p.starts_with("layers.1.feed_forward."); }) == 3);
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (item.key().find(".moe.") != std::string::npos) CHECK_FALSE(item.value().requires_grad());
  }
  qwen3::Qwen3 again(test::small_qwen3_moe(), 8, at::TensorOptions());
  CHECK_THROWS_WITH(nn::add_lora(again, {.target_modules = {"router.gate"}}),
                    Contains("lora.target_modules") && Contains("'router.gate' matching none") &&
                        Contains("MoE routers and routed experts take no adapters"));
}

TEST_CASE("float8 leaves LoRA adapters in high precision whichever converter runs first", "[nn][lora][float8]") {
  for (const bool lora_first : {true, false}) {
    INFO("lora first " << lora_first);
    llama3::Llama3 model(test::small_llama3(), 8, at::TensorOptions());
    // rank 16: the adapters' dims divide by 16, so only the rule keeps them out of float8.
    float8::Float8Conversion f8;
    if (lora_first) nn::add_lora(model, {.rank = 16});
    f8 = float8::convert_to_float8(model, {.config = {.emulate = true}});
    if (!lora_first) nn::add_lora(model, {.rank = 16});
    CHECK(f8.converted.size() == 2 * 7 + 1);
    for (const auto& item : model.named_modules("", /*include_self=*/false)) {
      auto* linear = dynamic_cast<nn::Linear*>(item.value().get());
      if (linear == nullptr || !linear->lora) continue;
      CHECK(linear->matmul);
      CHECK_FALSE(linear->lora->a->matmul);
      CHECK_FALSE(linear->lora->b->matmul);
    }
  }
}

TEST_CASE("bad LoRA settings fail naming their lora key", "[nn][lora][config]") {
  llama3::Llama3 model(test::small_llama3(), 8, at::TensorOptions());
  CHECK_THROWS_WITH(nn::add_lora(model, {.rank = 0}), Contains("expected lora.rank > 0, got 0"));
  CHECK_THROWS_WITH(nn::add_lora(model, {.alpha = -1}), Contains("expected lora.alpha > 0, got -1"));
  CHECK_THROWS_WITH(nn::add_lora(model, {.dropout = 1}), Contains("expected lora.dropout in [0, 1), got 1"));
  CHECK_THROWS_WITH(nn::add_lora(model, {.target_modules = {"wq", "wqq"}}),
                    Contains("expected each lora.target_modules entry to match a Linear of the model, got 'wqq'") &&
                        Contains("wq, wv") && Contains("Fix or remove the entry"));
  nn::add_lora(model, {.target_modules = {"wq"}});
  CHECK_THROWS_WITH(
      nn::add_lora(model, {.target_modules = {"wq"}}),
      Contains("expected 'layers.0.attention.wq' without adapters") && Contains("Name lora once in model.converters"));

  // The same settings as job keys fail when the config loads.
  CHECK_THROWS_WITH(parse({"--model.converters", "lora", "--lora.rank", "0"}),
                    Contains("expected lora.rank > 0, got 0") && Contains("--lora.rank"));
  CHECK_THROWS_WITH(parse({"--model.converters", "lora", "--lora.dropout", "1.5"}),
                    Contains("expected lora.dropout in [0, 1), got 1.5"));
  CHECK_THROWS_WITH(parse({"--model.converters", "lora", "--lora.target_modules", "wq,.wv"}),
                    Contains("lora.target_modules"));
  CHECK_THROWS_WITH(parse({"--lora.save_adapter_only", "true"}),
                    Contains("expected model.converters to hold lora with lora.save_adapter_only = true"));
  CHECK_THROWS_WITH(
      parse({"--model.converters", "lora", "--lora.save_adapter_only", "true", "--lora.merge_adapter", "true"}),
      Contains("lora.merge_adapter") && Contains("titan-convert to-hf --base"));
  CHECK_THROWS_WITH(
      parse({"--model.converters", "lora", "--lora.save_adapter_only", "true", "--checkpoint.enable", "true"}),
      Contains("expected checkpoint.initial_load_path") && Contains("lora.save_adapter_only"));
  const JobConfig ok =
      parse({"--model.converters", "float8,lora", "--lora.rank", "4", "--lora.target_modules", "wq,wv"});
  CHECK(ok.lora.rank == 4);
  CHECK(ok.lora.target_modules == std::vector<std::string>{"wq", "wv"});
}

}  // namespace lora_test
