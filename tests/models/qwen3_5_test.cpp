// SPDX-License-Identifier: BSD-3-Clause
// Qwen3.5 and Qwen3.5-MoE: every flavor's parameter count against transformers' model built from the config.json
// titan exports for it (the oracle, on the meta device), the block kinds and parameter names, forward and backward
// of both debug models, and the refusals of what is not built, in titan's error form.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "titan/models/qwen3_5/hf_adapter.hpp"
#include "titan/models/qwen3_5/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/parallel/planner.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace qwen3_5_test {

using titan::qwen3_5::Qwen35;
using titan::qwen3_5::Qwen35Args;

namespace {

std::shared_ptr<Qwen35> meta_model(const Qwen35Args& args) {
  return std::make_shared<Qwen35>(args, 64, at::TensorOptions().device(at::kMeta));
}

}  // namespace

TEST_CASE("qwen3_5 flavors' parameter counts equal transformers' models built from their configs",
          "[models][qwen3_5][full]") {
  titan::test::TempDir dir;
  nlohmann::json configs;
  std::map<std::string, int64_t> counts;
  const auto add = [&](const std::string& name, const Qwen35Args& args) {
    const auto model = meta_model(args);
    configs[name] = titan::qwen3_5::hf_adapter(args)->hf_config(at::kBFloat16);
    counts[name] = model->num_params();
  };
  for (const auto& name : titan::qwen3_5::flavor_names()) add(name, titan::qwen3_5::flavor(name));
  for (const auto& name : titan::qwen3_5::moe_flavor_names()) add(name, titan::qwen3_5::moe_flavor(name));
  const auto in = dir.path / "configs.json", out = dir.path / "counts.json";
  titan::test::write_file(in, configs.dump());
  REQUIRE(titan::test::run_python("qwen3_5_oracle.py",
                                  fmt::format("counts \"{}\" \"{}\"", in.string(), out.string())) == 0);
  const nlohmann::json oracle = nlohmann::json::parse(titan::test::read_file(out));
  REQUIRE(oracle.size() == counts.size());
  for (const auto& [name, count] : counts) {
    INFO(name);
    CHECK(count == oracle.at(name).get<int64_t>());
  }
  // The published sizes are what their names say (0.8B counts its tied embedding once).
  CHECK(counts.at("0.8B") == Approx(0.75e9).epsilon(0.1));
  CHECK(counts.at("9B") == Approx(9e9).epsilon(0.1));
  CHECK(counts.at("27B") == Approx(27e9).epsilon(0.1));
  CHECK(counts.at("35B-A3B") == Approx(35e9).epsilon(0.1));
}

TEST_CASE("qwen3_5 blocks alternate three Gated DeltaNet blocks and one gated softmax attention", "[models][qwen3_5]") {
  const auto model = meta_model(titan::qwen3_5::flavor("debugmodel"));
  for (const auto& block : model->layers) {
    INFO("block " << block->layer_id);
    const bool full = block->layer_id % 4 == 3;
    CHECK((block->attention_as<titan::nn::Attention>() != nullptr) == full);
    CHECK((block->attention_as<titan::nn::GatedDeltaNet>() != nullptr) == !full);
  }
  const auto named = model->named_parameters(/*recurse=*/true);
  // Gated attention: wq and its gate wg (8 heads of 64), a quarter of each head rotated.
  CHECK(named["layers.3.attention.wq.weight"].sizes() == at::IntArrayRef({8 * 64, 256}));
  CHECK(named["layers.3.attention.wg.weight"].sizes() == at::IntArrayRef({8 * 64, 256}));
  CHECK(model->layers[3]->attention_as<titan::nn::Attention>()->rotary_dim == 16);
  // Gated DeltaNet: 4 key heads of 32, 8 value heads of 32, a 4-tap convolution per q/k/v channel.
  CHECK(named["layers.0.attention.wq.weight"].sizes() == at::IntArrayRef({4 * 32, 256}));
  CHECK(named["layers.0.attention.wv.weight"].sizes() == at::IntArrayRef({8 * 32, 256}));
  CHECK(named["layers.0.attention.conv_v.weight"].sizes() == at::IntArrayRef({8 * 32, 4}));
  CHECK(named["layers.0.attention.decay.weight"].sizes() == at::IntArrayRef({8}));  // log A
  CHECK(named["layers.0.attention.wa.bias"].sizes() == at::IntArrayRef({8}));       // dt_bias
  CHECK(named["layers.0.attention.norm.weight"].sizes() == at::IntArrayRef({32}));
  CHECK_FALSE(named.contains("layers.0.attention.wg.weight"));
  CHECK_FALSE(named.contains("output.weight"));  // debugmodel ties the output to the embedding
  const auto moe = meta_model(titan::qwen3_5::moe_flavor("debugmodel_moe"))->named_parameters(/*recurse=*/true);
  CHECK(moe["layers.0.moe.experts.w1"].sizes() == at::IntArrayRef({8, 128, 256}));
  CHECK(moe["layers.0.moe.shared_experts.w1.weight"].sizes() == at::IntArrayRef({128, 256}));
  CHECK(moe["layers.0.moe.shared_gate.weight"].sizes() == at::IntArrayRef({1, 256}));
  CHECK_FALSE(moe.contains("layers.0.feed_forward.w1.weight"));
  // FLOPs: 6N plus the softmax term of the 2 full-attention blocks and the recurrence of the 6 others.
  const auto dense = meta_model(titan::qwen3_5::flavor("debugmodel"));
  const int64_t softmax = 6 * 8 * (64 + 64) * 2048, recurrence = 18 * 8 * 32 * 32;
  CHECK(dense->num_flops_per_token(2048) - dense->num_flops_per_token(1024) == 2 * (softmax - softmax / 2));
  CHECK(dense->num_flops_per_token(2048) ==
        6 * dense->num_params() + 2 * softmax + 6 * recurrence);  // tied: the embedding is the head's matmul
}

TEST_CASE("qwen3_5 debugmodel and debugmodel_moe run forward and backward", "[models][qwen3_5][full]") {
  const bool moe = GENERATE(false, true);
  INFO("moe " << moe);
  at::manual_seed(3);
  titan::nn::manual_init_seed(3);
  Qwen35 model(moe ? titan::qwen3_5::moe_flavor("debugmodel_moe") : titan::qwen3_5::flavor("debugmodel"), 80,
               at::TensorOptions());
  model.init_weights();
  const at::Tensor tokens = at::randint(0, model.vocab_size(), {1, 81}, at::kLong);  // (B, S+1): two 64-token chunks
  const at::Tensor logits = model.forward(tokens.narrow(1, 0, 80));                  // (B, S, V)
  const at::Tensor loss = at::cross_entropy_loss(logits.flatten(0, 1), tokens.narrow(1, 1, 80).flatten());
  loss.backward();
  // At init the normed hidden state has unit RMS and the output rows std D^-1/2: logits of std ~1 (a wrong scale
  // or a broken block lands far from it). The loss itself is not log(V): a tied model's residual stream is still
  // mostly the input token's own embedding row, which the output scores high.
  CHECK(logits.std().item<double>() == Approx(1.0).margin(0.3));
  CHECK(std::isfinite(loss.item<double>()));
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    INFO(item.key());
    const at::Tensor& g = item.value().grad();
    REQUIRE(g.defined());
    CHECK(at::isfinite(g).all().item<bool>());
    CHECK(g.abs().sum().item<double>() > 0);  // every tensor learns
  }
  // Zero-centred norms start at 0 (a scale of 1); the output norm of Gated DeltaNet at 1.
  CHECK(model.layers[0]->attention_norm->weight.eq(0).all().item<bool>());
  CHECK(model.layers[0]->attention_as<titan::nn::GatedDeltaNet>()->norm->weight.eq(1).all().item<bool>());
}

TEST_CASE("qwen3_5 computes each packed document as if it ran alone", "[models][qwen3_5]") {
  // Linear blocks restart their state and convolution at a document; the full-attention block masks across it and
  // rotates by positions within it. Tolerance: the same fp32 math over other chunk boundaries, ~1e-6 on logits ~1.
  Qwen35Args a{
      .dim = 64,
      .n_layers = 4,
      .n_heads = 4,
      .n_kv_heads = 2,
      .head_dim = 16,
      .vocab_size = 128,
      .hidden_dim = 128,
      .max_seq_len = 64,
      .linear = {.n_key_heads = 2, .n_value_heads = 4, .key_head_dim = 16, .value_head_dim = 8, .chunk_size = 8}};
  titan::nn::manual_init_seed(9);
  Qwen35 model(a, 24, at::TensorOptions());
  model.init_weights();
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::randint(0, 128, {1, 24}, at::kLong);                   // (B, S)
  const at::Tensor ids = (at::arange(24, at::kLong) >= 9).to(at::kLong).unsqueeze(0);  // (B, S): 9 + 15 tokens
  const at::Tensor positions = at::arange(24, at::kLong).unsqueeze(0) - 9 * ids;
  const at::Tensor packed = model.forward(tokens, {.positions = positions, .document_ids = ids});  // (B, S, V)
  const at::Tensor first = model.forward(tokens.narrow(1, 0, 9));
  const at::Tensor second = model.forward(tokens.narrow(1, 9, 15));
  INFO("max diff " << (packed.narrow(1, 9, 15) - second).abs().max().item<double>());
  CHECK(at::allclose(packed.narrow(1, 0, 9), first, 0, 1e-5));
  CHECK(at::allclose(packed.narrow(1, 9, 15), second, 0, 1e-5));
  // Without the ids the second document sees the first: a different function.
  CHECK_FALSE(at::allclose(model.forward(tokens).narrow(1, 9, 15), second, 0, 1e-3));
}

TEST_CASE("qwen3_5 refuses context, pipeline and expert parallelism with the reason", "[models][qwen3_5][errors]") {
  const auto dense = meta_model(titan::qwen3_5::flavor("debugmodel"));
  const auto plan_on = [&](const Qwen35& model, const titan::dist::MeshShape& mesh) {
    return titan::test::error_of([&] { titan::parallel::plan(model.sharding_spec(), {}, mesh); });
  };
  CHECK_THAT(plan_on(*dense, {.cp = 2}), Catch::Contains("[titan::qwen3_5::plan] expected cp = 1, got 2") &&
                                             Catch::Contains("Gated DeltaNet") &&
                                             Catch::Contains("context_parallel_degree 1"));
  const auto moe = meta_model(titan::qwen3_5::moe_flavor("debugmodel_moe"));
  CHECK_THAT(plan_on(*moe, {.pp = 2}), Catch::Contains("expected pp = 1, got 2") && Catch::Contains("not tested"));
  CHECK_THAT(plan_on(*moe, {.dp_shard = 2, .ep = 2}), Catch::Contains("expected ep = 1, got 2"));
  // Tensor parallelism splits a Gated DeltaNet block's heads: projections, convolution channels and decay rates.
  // (Untied: the skeleton's tied output has no vocab-parallel head.)
  Qwen35Args untied = titan::qwen3_5::flavor("debugmodel");
  untied.tie_word_embeddings = false;
  const titan::parallel::ParallelPlan tp = titan::parallel::plan(meta_model(untied)->sharding_spec(), {}, {.tp = 2});
  std::map<std::string, std::string> styles;
  for (const auto& [path, style] : tp.tensor_parallel.styles) styles[path] = titan::parallel::format_as(style);
  CHECK_THAT(styles.at("layers.0.attention.conv_v"), Catch::StartsWith("ColwiseParallel"));
  CHECK_THAT(styles.at("layers.0.attention.decay"), Catch::StartsWith("ColwiseParallel"));
  CHECK_THAT(styles.at("layers.0.attention.wo"), Catch::StartsWith("RowwiseParallel"));
  CHECK_THAT(styles.at("layers.3.attention.wg"), Catch::StartsWith("ColwiseParallel"));
  CHECK_FALSE(styles.contains("layers.0.attention.wg"));
  // FSDP is built.
  const titan::parallel::ParallelPlan fsdp = titan::parallel::plan(dense->sharding_spec(), {}, {.dp_shard = 2});
  CHECK(fsdp.data_parallel.units.size() == 1 + 8 + 1);
  // A config transformers would not load is refused naming the key.
  nlohmann::json hf = titan::qwen3_5::hf_adapter(titan::qwen3_5::flavor("debugmodel"))->hf_config(at::kFloat);
  hf["layer_types"] = std::vector<std::string>{"full_attention", "sliding_attention"};
  CHECK_THROWS_WITH(titan::qwen3_5::args_from_hf_config(hf),
                    Catch::Contains("[titan::qwen3_5] expected layer_types of n_layers = 8 entries"));
  hf["model_type"] = "qwen3_5";
  CHECK_THROWS_WITH(titan::qwen3_5::args_from_hf_config(hf), Catch::Contains("expected model_type qwen3_5_text"));
}

}  // namespace qwen3_5_test
