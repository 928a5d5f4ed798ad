// SPDX-License-Identifier: BSD-3-Clause
// Llama 3: flavor sizes and parameter counts on the meta device (torchtitan's figures), FLOPs per
// token, parameter names, causality and shapes on a tiny model.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/models/job_args.hpp"
#include "titan/models/llama3/model.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace llama3_test {

using titan::llama3::Llama3;
using titan::llama3::Llama3Args;

namespace {
std::shared_ptr<Llama3> meta_model(const std::string& flavor, int64_t seq_len = 2048) {
  return std::make_shared<Llama3>(titan::llama3::flavor(flavor), seq_len, at::TensorOptions().device(at::kMeta));
}
// torchtitan logs counts with 2 decimals in billions ("8.03B").
std::string billions(int64_t n) { return fmt::format("{:.2f}B", static_cast<double>(n) / 1e9); }

Llama3Args tiny_args() {
  return {.dim = 64,
          .n_layers = 2,
          .n_heads = 4,
          .n_kv_heads = 2,
          .vocab_size = 97,
          .multiple_of = 32,
          .rope_theta = 500000};
}
}  // namespace

TEST_CASE("llama3 parameter counts on meta equal torchtitan's", "[models][llama3]") {
  // Exact counts from torchtitan's flavor table (reference/torchtitan.md §3.1).
  CHECK(meta_model("debugmodel")->num_params() == 6'163'712);
  CHECK(meta_model("1B")->num_params() == 1'235'814'400);
  CHECK(meta_model("3B")->num_params() == 3'212'749'824);
  CHECK(meta_model("8B")->num_params() == 8'030'261'248);
  CHECK(meta_model("70B")->num_params() == 70'553'706'496);
  CHECK(meta_model("405B")->num_params() == 405'853'388'800);
  CHECK(billions(meta_model("8B")->num_params()) == "8.03B");
  CHECK(billions(meta_model("70B")->num_params()) == "70.55B");
  CHECK(billions(meta_model("405B")->num_params()) == "405.85B");
  // Nothing was allocated: every parameter lives on meta.
  for (const auto& p : meta_model("405B")->unique_parameters()) REQUIRE(p.device().is_meta());
}

TEST_CASE("llama3 FFN sizing and FLOPs per token", "[models][llama3]") {
  CHECK(titan::llama3::flavor("debugmodel").ffn_hidden_dim() == 768);
  CHECK(titan::llama3::flavor("8B").ffn_hidden_dim() == 14336);
  CHECK(titan::llama3::flavor("70B").ffn_hidden_dim() == 28672);
  CHECK(titan::llama3::flavor("405B").ffn_hidden_dim() == 53248);
  CHECK(titan::llama3::flavor("1B").ffn_hidden_dim() == 8192);
  // torchtitan: debugmodel at S=2048 is 7.16e7; 8B / 70B / 405B at S=8192 are 5.79e10 / 4.81e11 / 2.63e12.
  CHECK(meta_model("debugmodel")->num_flops_per_token(2048) == 71'585'280);
  CHECK(fmt::format("{:.2e}", static_cast<double>(meta_model("8B", 8192)->num_flops_per_token(8192))) == "5.79e+10");
  CHECK(fmt::format("{:.2e}", static_cast<double>(meta_model("70B", 8192)->num_flops_per_token(8192))) == "4.81e+11");
  CHECK(fmt::format("{:.2e}", static_cast<double>(meta_model("405B", 8192)->num_flops_per_token(8192))) == "2.63e+12");
}

TEST_CASE("llama3 parameter names follow torchtitan's FQNs", "[models][llama3]") {
  const auto model = meta_model("debugmodel");
  const auto named = model->named_parameters(/*recurse=*/true);
  CHECK(named.size() == 2 + 6 * 9 + 1);
  for (const char* key :
       {"tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.0.attention.wk.weight",
        "layers.0.attention.wv.weight", "layers.0.attention.wo.weight", "layers.5.feed_forward.w1.weight",
        "layers.5.feed_forward.w2.weight", "layers.5.feed_forward.w3.weight", "layers.3.attention_norm.weight",
        "layers.3.ffn_norm.weight", "norm.weight", "output.weight"}) {
    INFO(key);
    CHECK(named.contains(key));
  }
  CHECK(named["layers.0.attention.wq.weight"].sizes() == at::IntArrayRef({256, 256}));
  CHECK(named["layers.0.feed_forward.w1.weight"].sizes() == at::IntArrayRef({768, 256}));
  // Tied flavors own no output.weight.
  CHECK_FALSE(meta_model("1B")->named_parameters().contains("output.weight"));
}

TEST_CASE("llama3 init follows torchtitan's scheme", "[models][llama3]") {
  at::manual_seed(0);
  Llama3 model({.dim = 256, .n_layers = 4, .n_heads = 8, .vocab_size = 512, .rope_theta = 500000}, 16,
               at::TensorOptions());
  model.init_weights();
  auto named = model.named_parameters();
  CHECK(named["tok_embeddings.weight"].std().item<double>() == Approx(1.0).epsilon(0.02));
  CHECK(named["layers.0.attention.wq.weight"].std().item<double>() == Approx(0.02).epsilon(0.03));
  // Depth-scaled output projections: 0.02 / sqrt(2 * (layer + 1)).
  CHECK(named["layers.3.attention.wo.weight"].std().item<double>() == Approx(0.02 / std::sqrt(8.0)).epsilon(0.03));
  CHECK(named["layers.1.feed_forward.w2.weight"].std().item<double>() == Approx(0.02 / 2.0).epsilon(0.03));
  const auto out = named["output.weight"];
  CHECK(out.abs().max().item<double>() <= 3.0 / 16.0 + 1e-6);  // cut at 3 std, std = dim^-0.5
  CHECK(named["norm.weight"].eq(1).all().item<bool>());
}

TEST_CASE("llama3 forward is causal and shaped (B, S, V)", "[models][llama3]") {
  at::manual_seed(1);
  Llama3 model(tiny_args(), 12, at::TensorOptions());
  model.init_weights();
  const at::Tensor tokens = at::randint(0, 97, {2, 12}, at::kLong);  // (B, S)
  const at::Tensor logits = model.forward(tokens);                   // (B, S, V)
  CHECK(logits.sizes() == at::IntArrayRef({2, 12, 97}));
  at::Tensor changed = tokens.clone();
  changed.select(1, 8).fill_((tokens[0][8].item<int64_t>() + 1) % 97);
  const at::Tensor logits2 = model.forward(changed);
  // Positions before 8 must not see the change; position 8 onwards must.
  CHECK(at::allclose(logits.narrow(1, 0, 8), logits2.narrow(1, 0, 8), 1e-6, 1e-6));
  CHECK_FALSE(at::allclose(logits.narrow(1, 8, 4), logits2.narrow(1, 8, 4), 1e-6, 1e-6));
}

TEST_CASE("llama3 sizes the model to a seq_len past the flavor's max and rejects an unknown flavor",
          "[models][llama3][errors]") {
  using Job = titan::models::JobArgs<Llama3>;
  titan::JobConfig config;
  // torchtitan's update_from_config: max_seq_len becomes the job's sequence length (a warning past the flavor's).
  config.training.seq_len = 200'000;
  CHECK(Job::make(config).max_seq_len == 200'000);
  CHECK(Llama3::build(Job::make(config))->seq_len() == 200'000);
  CHECK_THROWS_WITH(Llama3(titan::llama3::flavor("debugmodel"), 200'000, at::TensorOptions().device(at::kMeta)),
                    Catch::Contains("training.seq_len") && Catch::Contains("131072"));
  config.training.seq_len = 64;
  config.model.flavor = "9B";
  CHECK_THROWS_WITH(Job::make(config), Catch::Contains("model.flavor") && Catch::Contains("debugmodel"));
}

}  // namespace llama3_test
