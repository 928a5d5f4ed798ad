// SPDX-License-Identifier: BSD-3-Clause
// DeepSeek-V3: the flavors' parameter counts, FLOPs per token and parameter names against torchtitan
// 0.2.2's model built on the meta device (the oracle), YaRN frequencies against torchtitan's
// precompute_freqs_cis, and a forward/backward of the debug model (causal, every parameter reached).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/config.hpp"
#include "titan/models/deepseek_v3/model.hpp"
#include "titan/models/job_args.hpp"
#include "titan/nn/init.hpp"

using titan::deepseek_v3::DeepSeekV3;
using titan::deepseek_v3::DeepSeekV3Args;
namespace fs = std::filesystem;

namespace {
std::shared_ptr<DeepSeekV3> deepseek_meta_model(const std::string& flavor, int64_t seq_len = 2048) {
  return std::make_shared<DeepSeekV3>(titan::deepseek_v3::flavor(flavor), seq_len,
                                      at::TensorOptions().device(at::kMeta));
}
}  // namespace

TEST_CASE("deepseek_v3 flavors have torchtitan's parameter counts and FLOPs and names", "[models][deepseek_v3][full]") {
  titan::test::TempDir dir;
  const fs::path out = dir.path / "counts.json";
  REQUIRE(titan::test::run_python("torchtitan_deepseek_v3.py", fmt::format("counts \"{}\" 2048", out.string())) == 0);
  const auto oracle = nlohmann::json::parse(titan::test::read_file(out));
  for (const std::string flavor : {"debugmodel", "16B", "236B", "671B"}) {
    INFO(flavor);
    const auto model = deepseek_meta_model(flavor);
    CHECK(model->num_params() == oracle[flavor]["params"].get<int64_t>());
    // Active parameters only: top_k / num_experts of the routed experts.
    CHECK(model->num_flops_per_token(2048) == oracle[flavor]["flops"].get<int64_t>());
    if (!oracle[flavor].contains("shapes")) continue;
    std::map<std::string, std::vector<int64_t>> titan_shapes, want;
    for (const auto& item : model->named_parameters()) titan_shapes[item.key()] = item.value().sizes().vec();
    for (const auto& [name, shape] : oracle[flavor]["shapes"].items()) want[name] = shape.get<std::vector<int64_t>>();
    CHECK(titan_shapes == want);
  }
  // The figures torchtitan logs (2 decimals, billions) and nothing allocated.
  CHECK(fmt::format("{:.2f}B", static_cast<double>(deepseek_meta_model("671B")->num_params()) / 1e9) == "671.03B");
  for (const auto& p : deepseek_meta_model("671B")->unique_parameters()) REQUIRE(p.device().is_meta());
}

TEST_CASE("deepseek_v3 YaRN frequencies equal torchtitan's", "[models][deepseek_v3][rope][full]") {
  titan::test::TempDir dir;
  const fs::path out = dir.path / "freqs.safetensors";
  REQUIRE(titan::test::run_python("torchtitan_deepseek_v3.py", fmt::format("freqs \"{}\"", out.string())) == 0);
  const titan::checkpoint::SafetensorsFile oracle(out);
  struct Case {
    const char* name;
    titan::nn::YarnConfig yarn;
    int64_t positions;
  };
  for (const Case& c :
       {Case{"v3", {}, 8192}, Case{"small", {.head_dim = 16, .factor = 4.0, .original_max_positions = 32}, 64}}) {
    INFO(c.name);
    const at::Tensor freqs = titan::nn::yarn_frequencies(c.yarn);  // (ROPE/2)
    const at::Tensor table = at::view_as_real(titan::nn::make_rope_tables(freqs, c.positions, at::kCPU).freqs_cis);
    const at::Tensor want = oracle.read(c.name);  // (S, ROPE/2, 2)
    REQUIRE(table.sizes() == want.sizes());
    // The same float32 arithmetic in the same order, the same polar kernel: equal bitwise.
    CHECK(at::equal(table, want));
  }
  // The model switches YaRN on past original_seq_len (torchtitan's rule) and scales the softmax by mscale^2.
  const DeepSeekV3Args debug = titan::deepseek_v3::flavor("debugmodel");
  CHECK_FALSE(debug.uses_yarn(4096));
  CHECK(debug.uses_yarn(4097));
  CHECK(debug.softmax_mscale(2048) == 1.0);
  const double m = 0.1 * 0.70 * std::log(40.0) + 1.0;
  CHECK(debug.softmax_mscale(8192) == Approx(m * m).epsilon(1e-12));
}

TEST_CASE("deepseek_v3 debug model: a causal forward and a gradient for every parameter", "[models][deepseek_v3]") {
  titan::nn::manual_init_seed(7);
  // The debug flavor with a smaller vocabulary, and the low-rank query path (236B's) in a second run.
  const bool q_lora = GENERATE(false, true);
  INFO("q_lora_rank " << (q_lora ? 64 : 0));
  DeepSeekV3Args args = titan::deepseek_v3::flavor("debugmodel");
  args.n_layers = 3;
  args.vocab_size = 97;
  if (q_lora) args.q_lora_rank = 64;
  DeepSeekV3 model(args, 16, at::TensorOptions());
  model.init_weights();
  CHECK(model.moe_layers().size() == 2);
  const at::Tensor tokens = at::randint(0, 97, {2, 16}, at::make_generator<at::CPUGeneratorImpl>(3), at::kLong);
  const at::Tensor logits = model.forward(tokens);  // (B, S, V)
  REQUIRE(logits.sizes() == at::IntArrayRef({2, 16, 97}));
  CHECK(logits.isfinite().all().item<bool>());
  at::Tensor changed = tokens.clone();
  changed.select(1, 10).fill_((tokens[0][10].item<int64_t>() + 1) % 97);
  {
    at::NoGradGuard no_grad;
    const at::Tensor again = model.forward(changed);
    CHECK(at::allclose(logits.narrow(1, 0, 10), again.narrow(1, 0, 10), 1e-6, 1e-6));
    CHECK_FALSE(at::allclose(logits.narrow(1, 10, 6), again.narrow(1, 10, 6), 1e-6, 1e-6));
  }
  at::cross_entropy_loss(logits.reshape({-1, 97}), tokens.reshape({-1})).backward();
  for (const auto& item : model.named_parameters()) {
    INFO(item.key());
    REQUIRE(item.value().grad().defined());
    CHECK(item.value().grad().abs().sum().item<double>() > 0);
  }
}

TEST_CASE("deepseek_v3 rejects an unknown flavor or another model name and takes a seq_len past the flavor's",
          "[models][deepseek_v3][errors]") {
  using Job = titan::models::JobArgs<DeepSeekV3>;
  titan::JobConfig config;
  config.model.name = "deepseek_v3";
  config.model.flavor = "7B";
  config.training.seq_len = 64;
  CHECK_THROWS_WITH(Job::make(config), Catch::Contains("model.flavor") && Catch::Contains("671B"));
  config.model.flavor = "debugmodel";
  // torchtitan sizes the model to the job's sequence, past the flavor's 163840 with a warning.
  config.training.seq_len = 200'000;
  CHECK(Job::make(config).max_seq_len == 200'000);
  config.model.name = "llama3";
  CHECK_THROWS_WITH(Job::make(config), Catch::Contains("model.name"));
}
