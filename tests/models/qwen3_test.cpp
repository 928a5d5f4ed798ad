// SPDX-License-Identifier: BSD-3-Clause
// Qwen3 and Qwen3-MoE: every flavor's parameter count and FLOPs per token against torchtitan 0.2.2's
// model built on the meta device (the oracle), parameter names, which layers are MoE, a pipeline
// part's init equal to the whole model's, forward and backward on debugmodel and debugmodel_moe, and
// the errors for a bad MoE config.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/models/job_args.hpp"
#include "titan/models/qwen3/hf_adapter.hpp"
#include "titan/models/qwen3/model.hpp"
#include "titan/nn/init.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace qwen3_test {

using titan::qwen3::Qwen3;
using titan::qwen3::Qwen3Args;

namespace {

std::shared_ptr<Qwen3> meta_model(const std::string& flavor, int64_t seq_len = 2048) {
  return std::make_shared<Qwen3>(titan::qwen3::flavor(flavor), seq_len, at::TensorOptions().device(at::kMeta));
}

// A small MoE with one dense layer among three, so both block kinds and their init streams count.
Qwen3Args small_moe_args() {
  Qwen3Args a{.dim = 32,
              .n_layers = 3,
              .n_heads = 4,
              .n_kv_heads = 2,
              .vocab_size = 64,
              .head_dim = 16,
              .hidden_dim = 48,
              .moe_enabled = true,
              .moe_inter_dim = 16,
              .mlp_only_layers = {1}};
  a.moe.num_experts = 4;
  a.moe.num_shared_experts = 1;
  a.moe.top_k = 2;
  return a;
}

// Forward and backward of a next-token loss on random tokens; returns the loss.
double forward_backward(Qwen3& model, int64_t seq_len) {
  const at::Tensor tokens = at::randint(0, model.vocab_size(), {1, seq_len + 1}, at::kLong);  // (B, S+1)
  const at::Tensor logits = model.forward(tokens.narrow(1, 0, seq_len));                      // (B, S, V)
  const at::Tensor loss = at::cross_entropy_loss(logits.flatten(0, 1), tokens.narrow(1, 1, seq_len).flatten());
  loss.backward();
  return loss.item<double>();
}

}  // namespace

TEST_CASE("qwen3 flavors' parameter counts and FLOPs equal torchtitan's", "[models][qwen3][full]") {
  titan::test::TempDir dir;
  const auto out = dir.path / "counts.json";
  constexpr int64_t kSeq = 2048;
  REQUIRE(titan::test::run_python("qwen3_oracle.py", fmt::format("counts \"{}\" {}", out.string(), kSeq)) == 0);
  const nlohmann::json oracle = nlohmann::json::parse(titan::test::read_file(out));
  std::vector<std::string> oracle_names;
  for (const auto& [name, _] : oracle.items()) oracle_names.push_back(name);
  std::sort(oracle_names.begin(), oracle_names.end());
  // tiny_moe is titan's own (the parity tests' model), not one of torchtitan's.
  std::vector<std::string> names = titan::qwen3::flavor_names();
  std::erase(names, "tiny_moe");
  CHECK(names == oracle_names);
  for (const auto& name : names) {
    INFO(name);
    const auto model = meta_model(name, kSeq);
    const Qwen3Args& a = model->args();
    const nlohmann::json& want = oracle.at(name);
    // Every parameter once, experts included.
    CHECK(model->num_params() == want.at("params").get<int64_t>());
    // torchtitan's reported count leaves out a tied embedding; its FLOPs leave out the tied output
    // matmul, which titan counts (6 * V * D per token).
    const int64_t tied = a.tie_word_embeddings ? a.vocab_size * a.dim : 0;
    CHECK(model->num_params() - tied == want.at("nparams").get<int64_t>());
    CHECK(model->num_flops_per_token(kSeq) - 6 * tied == want.at("flops").get<int64_t>());
  }
  // MoE FLOPs count active experts only: 30B-A3B is ~3B active, so far below 6 * 30B per token.
  const auto a3b = meta_model("30B-A3B");
  CHECK(a3b->num_flops_per_token(kSeq) < 6 * a3b->num_params() / 5);
  for (const auto& p : meta_model("235B-A22B")->unique_parameters()) REQUIRE(p.device().is_meta());
}

TEST_CASE("qwen3 parameter names follow torchtitan's FQNs", "[models][qwen3]") {
  const auto dense = meta_model("debugmodel");
  const auto named = dense->named_parameters(/*recurse=*/true);
  CHECK(named.size() == 1 + 8 * 11 + 1);  // embedding, 8 x (4 projections, 2 q/k norms, 3 FFN, 2 norms), norm
  CHECK(named["layers.0.attention.wq.weight"].sizes() == at::IntArrayRef({16 * 128, 256}));
  CHECK(named["layers.0.attention.wk.weight"].sizes() == at::IntArrayRef({8 * 128, 256}));
  CHECK(named["layers.0.attention.q_norm.weight"].sizes() == at::IntArrayRef({128}));
  CHECK(named["layers.7.feed_forward.w1.weight"].sizes() == at::IntArrayRef({3072, 256}));
  CHECK_FALSE(named.contains("output.weight"));  // debugmodel ties the output to the embedding
  const auto moe = meta_model("debugmodel_moe")->named_parameters(/*recurse=*/true);
  CHECK(moe["layers.3.moe.experts.w1"].sizes() == at::IntArrayRef({64, 768, 256}));
  CHECK(moe["layers.3.moe.experts.w2"].sizes() == at::IntArrayRef({64, 256, 768}));
  CHECK(moe["layers.3.moe.router.gate.weight"].sizes() == at::IntArrayRef({64, 256}));
  CHECK(moe.contains("output.weight"));
  CHECK_FALSE(moe.contains("layers.3.feed_forward.w1.weight"));
  CHECK_FALSE(moe.contains("layers.3.moe.shared_experts.w1.weight"));
}

TEST_CASE("qwen3 MoE layers follow transformers' decoder_sparse_step and mlp_only_layers", "[models][qwen3]") {
  Qwen3Args a = titan::qwen3::flavor("debugmodel_moe");
  for (int64_t i = 0; i < a.n_layers; ++i) CHECK(a.is_moe_layer(i));
  a.decoder_sparse_step = 2;  // transformers: layer i is sparse when (i + 1) % step == 0
  a.mlp_only_layers = {3};
  std::vector<int64_t> sparse;
  for (int64_t i = 0; i < a.n_layers; ++i) {
    if (a.is_moe_layer(i)) sparse.push_back(i);
  }
  CHECK(sparse == std::vector<int64_t>{1, 5, 7});
  const Qwen3 model(a, 16, at::TensorOptions().device(at::kMeta));
  CHECK(model.layers[3]->feed_forward != nullptr);
  CHECK(model.layers[3]->moe == nullptr);
  CHECK(model.layers[5]->moe != nullptr);
  CHECK(model.moe_layers().size() == 3);
  CHECK_FALSE(titan::qwen3::flavor("8B").is_moe_layer(0));
}

TEST_CASE("qwen3 part init equals the whole model's init", "[models][qwen3]") {
  const Qwen3Args a = small_moe_args();
  titan::nn::manual_init_seed(7);
  Qwen3 whole(a, 8, at::TensorOptions());
  whole.init_weights();
  titan::nn::manual_init_seed(7);
  Qwen3 part(a, 8, at::TensorOptions(), {"layers.1", "layers.2", "norm", "output"});
  part.init_weights();
  const auto want = whole.named_parameters(/*recurse=*/true);
  const auto got = part.named_parameters(/*recurse=*/true);
  CHECK(got.size() == want.size() - 1 - 15);  // no embedding, no layer 0 (an MoE block: 15 tensors)
  for (const auto& item : got) {
    INFO(item.key());
    CHECK(at::equal(item.value(), want[item.key()]));
  }
  // Routed experts draw trunc-normal(0.02) / the block's init std; the expert bias starts at zero.
  CHECK(whole.layers[2]->moe->expert_bias.eq(0).all().item<bool>());
  CHECK(whole.layers[0]->attention_as<titan::nn::Attention>()->q_norm->weight.eq(1).all().item<bool>());
}

TEST_CASE("qwen3 debugmodel and debugmodel_moe run forward and backward", "[models][qwen3][full]") {
  const std::string flavor = GENERATE("debugmodel", "debugmodel_moe");
  INFO(flavor);
  at::manual_seed(3);
  titan::nn::manual_init_seed(3);
  Qwen3 model(titan::qwen3::flavor(flavor), 32, at::TensorOptions());
  model.init_weights();
  const double loss = forward_backward(model, 32);
  // At init the hidden state has unit RMS and the output rows std D^-1/2, so logits of std ~1: the
  // loss is near log(V) + 1/2 = 8.12 (a wrong scale or a broken block lands far from it).
  CHECK(loss == Approx(std::log(2048.0) + 0.5).margin(0.5));
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    INFO(item.key());
    const at::Tensor& g = item.value().grad();
    REQUIRE(g.defined());
    CHECK(at::isfinite(g).all().item<bool>());
    CHECK(g.abs().sum().item<double>() > 0);  // every tensor learns (32 tokens x top-8 reach every expert tensor)
  }
  if (flavor == "debugmodel_moe") {
    // The router chose top_k experts per token in every MoE layer.
    for (const auto& moe : model.moe_layers()) CHECK(moe->tokens_per_expert.sum().item<double>() == 32 * 8);
  }
}

TEST_CASE("qwen3 refuses a top_k larger than the experts with the fix", "[models][qwen3][errors]") {
  Qwen3Args a = titan::qwen3::flavor("debugmodel_moe");
  a.moe.top_k = 65;
  CHECK_THROWS_WITH(Qwen3(a, 16, at::TensorOptions().device(at::kMeta)),
                    Catch::Contains("[titan::qwen3] expected the MoE's top_k") && Catch::Contains("num_experts = 64") &&
                        Catch::Contains("got top_k 65") && Catch::Contains("Lower top_k or add experts"));
  // The same from a Hugging Face config.json.
  const nlohmann::json hf = {{"model_type", "qwen3_moe"},   {"hidden_size", 32},       {"intermediate_size", 48},
                             {"moe_intermediate_size", 16}, {"num_hidden_layers", 2},  {"num_attention_heads", 4},
                             {"num_key_value_heads", 2},    {"head_dim", 8},           {"vocab_size", 64},
                             {"num_local_experts", 4},      {"num_experts_per_tok", 6}};
  CHECK_THROWS_WITH(titan::qwen3::args_from_hf_config(hf),
                    Catch::Contains("num_experts_per_tok") && Catch::Contains("got top_k 6"));
  titan::JobConfig config;
  config.model.name = "qwen3";
  config.model.flavor = "7B";
  using Job = titan::models::JobArgs<Qwen3>;
  CHECK_THROWS_WITH(Job::make(config), Catch::Contains("model.flavor") && Catch::Contains("debugmodel_moe"));
  config.model.name = "llama3";
  config.model.flavor = "debugmodel";
  CHECK_THROWS_WITH(Job::make(config), Catch::Contains("model.name = 'qwen3'"));
}

}  // namespace qwen3_test
