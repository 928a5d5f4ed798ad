// SPDX-License-Identifier: BSD-3-Clause
// gpt-oss: the 20b and 120b flavors built on the meta device against torchtitan's and transformers' models
// (the oracle, tests/oracles/hf_gpt_oss.py counts): parameter count, FLOPs per token, and every parameter's
// name and shape, torchtitan's fused mlp1 being titan's w1 + w3 and HF's through the adapter. Then the
// debugmodel's names, which blocks slide, a part's init equal to the whole's, forward and backward, KV-cache
// decoding equal to the forward, and the errors (context and tensor parallelism refused with the reason).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/gpt_oss/hf_adapter.hpp"
#include "titan/models/gpt_oss/model.hpp"
#include "titan/models/job_args.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/kv_cache.hpp"
#include "titan/parallel/planner.hpp"

using titan::gpt_oss::GptOss;
using titan::gpt_oss::GptOssArgs;

namespace {

std::shared_ptr<GptOss> gpt_oss_meta_model(const std::string& flavor, int64_t seq_len = 2048) {
  return std::make_shared<GptOss>(titan::gpt_oss::flavor(flavor), seq_len, at::TensorOptions().device(at::kMeta));
}

// Three blocks (sliding, full, sliding) over a window of 4, 4 experts top-2.
GptOssArgs small_args() {
  GptOssArgs a{.dim = 32,
               .n_layers = 3,
               .n_heads = 4,
               .n_kv_heads = 2,
               .head_dim = 8,
               .vocab_size = 64,
               .moe_inter_dim = 16,
               .sliding_window = 4,
               .moe = titan::gpt_oss::gpt_oss_moe(4)};
  a.moe.top_k = 2;
  return a;
}

// torchtitan's name of a titan parameter: the gate and up experts (and biases) are its fused mlp1.
std::string torchtitan_name(const std::string& name) {
  static const std::pair<const char*, const char*> renames[] = {
      {".experts.w1_bias", ".experts.mlp1_bias"}, {".experts.w3_bias", ".experts.mlp1_bias"},
      {".experts.w2_bias", ".experts.mlp2_bias"}, {".experts.w1", ".experts.mlp1_weight"},
      {".experts.w3", ".experts.mlp1_weight"},    {".experts.w2", ".experts.mlp2_weight"}};
  for (const auto& [titan, torchtitan] : renames) {
    if (name.ends_with(titan)) return name.substr(0, name.size() - std::string(titan).size()) + torchtitan;
  }
  return name;
}

using Shapes = std::map<std::string, std::vector<int64_t>>;

// Fused names get the sizes of their parts added along dim 1 (mlp1 is (E, 2F, D), its bias (E, 2F)).
void add_part(Shapes& shapes, const std::string& name, std::vector<int64_t> shape) {
  auto [it, fresh] = shapes.emplace(name, shape);
  if (!fresh) it->second[1] += shape[1];
}

}  // namespace

TEST_CASE("gpt_oss 20b and 120b: parameters, FLOPs and names equal torchtitan's and transformers'",
          "[models][gpt_oss][slow]") {
  titan::test::TempDir dir;
  const auto out = dir.path / "counts.json";
  constexpr int64_t kSeq = 2048;
  REQUIRE(titan::test::run_python("hf_gpt_oss.py", fmt::format("counts \"{}\" {}", out.string(), kSeq)) == 0);
  const nlohmann::json oracle = nlohmann::json::parse(titan::test::read_file(out));
  for (const std::string name : {"20b", "120b"}) {
    INFO(name);
    const auto model = gpt_oss_meta_model(name, kSeq);
    const nlohmann::json& want = oracle.at("flavors").at(name);
    CHECK(model->num_params() == want.at("params").get<int64_t>());
    CHECK(model->num_params() == want.at("hf_params").get<int64_t>());
    CHECK(model->num_flops_per_token(kSeq) == want.at("flops").get<int64_t>());
  }
  // OpenAI's published totals: 20.91B and 116.83B parameters.
  CHECK(gpt_oss_meta_model("20b")->num_params() == 20'914'757'184);
  CHECK(gpt_oss_meta_model("120b")->num_params() == 116'829'156'672);

  const auto model = gpt_oss_meta_model("20b", kSeq);
  const auto adapter = model->hf_adapter();
  Shapes torchtitan, hf;
  std::map<std::string, std::vector<std::pair<std::string, at::Tensor>>> hf_pieces;
  for (const auto& item : model->named_parameters()) {
    add_part(torchtitan, torchtitan_name(item.key()), item.value().sizes().vec());
    for (auto& [hf_name, t] : adapter->to_hf_tensors(item.key(), item.value())) {
      hf_pieces[hf_name].emplace_back(item.key(), t);
    }
  }
  for (const auto& [hf_name, pieces] : hf_pieces) {
    hf[hf_name] = (pieces.size() == 1 ? pieces[0].second : adapter->join_hf(hf_name, pieces)).sizes().vec();
  }
  CHECK(torchtitan == oracle.at("torchtitan").get<Shapes>());
  CHECK(hf == oracle.at("hf").get<Shapes>());
  // The expert bias has no HF twin: an export leaves it out.
  CHECK(adapter->to_hf_tensors("layers.0.moe.expert_bias", at::zeros({32})).empty());
}

TEST_CASE("gpt_oss parameter names and which blocks slide", "[models][gpt_oss]") {
  const auto model = gpt_oss_meta_model("debugmodel");
  const auto named = model->named_parameters(/*recurse=*/true);
  // embedding; 4 x (4 projections with biases, sinks, 2 norms, router weight and bias, 6 expert tensors); norm, output
  CHECK(named.size() == 1 + 4 * 19 + 2);
  CHECK(named["layers.0.attention.wq.weight"].sizes() == at::IntArrayRef({8 * 64, 256}));
  CHECK(named["layers.0.attention.wq.bias"].sizes() == at::IntArrayRef({8 * 64}));
  CHECK(named["layers.0.attention.wk.bias"].sizes() == at::IntArrayRef({2 * 64}));
  CHECK(named["layers.0.attention.wo.bias"].sizes() == at::IntArrayRef({256}));
  CHECK(named["layers.0.attention.sinks"].sizes() == at::IntArrayRef({8}));
  CHECK(named["layers.3.moe.router.gate.bias"].sizes() == at::IntArrayRef({8}));
  CHECK(named["layers.3.moe.experts.w1"].sizes() == at::IntArrayRef({8, 512, 256}));
  CHECK(named["layers.3.moe.experts.w1_bias"].sizes() == at::IntArrayRef({8, 512}));
  CHECK(named["layers.3.moe.experts.w2_bias"].sizes() == at::IntArrayRef({8, 256}));
  CHECK(named.contains("output.weight"));
  CHECK(model->moe_layers().size() == 4);
  for (const auto& layer : model->layers) {
    INFO("block " << layer->layer_id);
    const auto attention = layer->attention_as<titan::nn::Attention>();
    REQUIRE(attention != nullptr);
    CHECK(attention->sliding_window == (layer->layer_id % 2 == 0 ? 128 : 0));
    CHECK(layer->moe->args.activation == titan::nn::ExpertActivation::clamped_swiglu);
  }
}

TEST_CASE("gpt_oss part init equals the whole model's init", "[models][gpt_oss]") {
  titan::nn::manual_init_seed(7);
  GptOss whole(small_args(), 8, at::TensorOptions());
  whole.init_weights();
  titan::nn::manual_init_seed(7);
  GptOss part(small_args(), 8, at::TensorOptions(), {"layers.1", "layers.2", "norm", "output"});
  part.init_weights();
  const auto want = whole.named_parameters(/*recurse=*/true);
  const auto got = part.named_parameters(/*recurse=*/true);
  CHECK(got.size() == want.size() - 1 - 19);
  for (const auto& item : got) {
    INFO(item.key());
    CHECK(at::equal(item.value(), want[item.key()]));
  }
  // torchtitan's gpt-oss init: the biases and sinks drawn (non-zero), the router bias level.
  const auto attention = whole.layers[0]->attention_as<titan::nn::Attention>();
  CHECK(attention->sinks.abs().min().item<double>() > 0);
  CHECK(attention->wq->bias.abs().max().item<double>() > 0);
  CHECK(whole.layers[0]->moe->router->gate->bias.eq(0).all().item<bool>());
}

TEST_CASE("gpt_oss debugmodel runs forward and backward, every tensor learning", "[models][gpt_oss][full]") {
  at::manual_seed(3);
  titan::nn::manual_init_seed(3);
  GptOss model(titan::gpt_oss::flavor("debugmodel"), 32, at::TensorOptions());
  model.init_weights();
  const at::Tensor tokens = at::randint(0, model.vocab_size(), {1, 33}, at::kLong);  // (B, S+1)
  const at::Tensor logits = model.forward(tokens.narrow(1, 0, 32));                  // (B, S, V)
  const at::Tensor loss = at::cross_entropy_loss(logits.flatten(0, 1), tokens.narrow(1, 1, 32).flatten());
  loss.backward();
  // Unit-RMS hidden state into output rows of std D^-1/2: logits of std ~1, a loss near log(V) + 1/2.
  CHECK(loss.item<double>() == Approx(std::log(2048.0) + 0.5).margin(0.5));
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    INFO(item.key());
    const at::Tensor& g = item.value().grad();
    REQUIRE(g.defined());
    CHECK(at::isfinite(g).all().item<bool>());
    CHECK(g.abs().sum().item<double>() > 0);
  }
  for (const auto& moe : model.moe_layers()) CHECK(moe->tokens_per_expert.sum().item<double>() == 32 * 4);
}

TEST_CASE("gpt_oss decoding over a KV cache gives the forward's logits", "[models][gpt_oss]") {
  titan::nn::manual_init_seed(11);
  GptOss model(small_args(), 12, at::TensorOptions());
  model.init_weights();
  const at::Tensor tokens = at::randint(0, 64, {2, 12}, at::make_generator<at::CPUGeneratorImpl>(4), at::kLong);
  at::NoGradGuard no_grad;
  const at::Tensor want = model.forward(tokens);  // (B, S, V), past the window of 4
  titan::nn::KVCache cache(3, 12);
  at::Tensor got = model.forward_cached(tokens.narrow(1, 0, 6), cache);  // the prompt, then one at a time
  for (int64_t s = 6; s < 12; ++s) got = at::cat({got, model.forward_cached(tokens.narrow(1, s, 1), cache)}, 1);
  CHECK((got - want).abs().max().item<double>() < 1e-5);
}

TEST_CASE(
    "gpt_oss refuses the K/V context-parallel exchanges and tensor parallelism with the reason, and bad arguments",
    "[models][gpt_oss][errors]") {
  const GptOss model(small_args(), 8, at::TensorOptions().device(at::kMeta));
  titan::JobConfig config;
  config.model.name = "gpt_oss";
  for (const titan::dist::MeshShape shape : {titan::dist::MeshShape{.cp = 2}, titan::dist::MeshShape{.tp = 2}}) {
    const std::string error =
        titan::test::error_of([&] { (void)titan::parallel::plan(model.sharding_spec(), {}, shape); });
    const bool cp = shape.cp == 2;
    INFO(error);
    CHECK_THAT(error, Catch::Contains(cp ? "expected cp = 1 under context_parallel_rotate_method allgather, got 2: "
                                           "the attention sinks and the sliding window"
                                         : "expected tp = 1, got 2: tensor parallelism of the biased"));
  }
  titan::parallel::PlanOptions ulysses;  // the one context parallelism gpt-oss takes
  ulysses.parallelism.context_parallel_rotate_method = titan::CpRotateMethod::ulysses;
  CHECK_NOTHROW(titan::parallel::plan(model.sharding_spec(), ulysses, {.cp = 2}));
  GptOssArgs a = small_args();
  a.sliding_window = 0;
  CHECK_THROWS_WITH(GptOss(a, 8, at::TensorOptions().device(at::kMeta)),
                    Catch::Contains("[titan::gpt_oss] expected sliding_window >= 1") && Catch::Contains("128"));
  a = small_args();
  a.moe.top_k = 5;
  CHECK_THROWS_WITH(GptOss(a, 8, at::TensorOptions().device(at::kMeta)),
                    Catch::Contains("got top_k 5") && Catch::Contains("Lower top_k or add experts"));
  nlohmann::json hf = titan::gpt_oss::hf_adapter(small_args())->hf_config(at::kFloat);
  hf["rope_parameters"].erase("truncate");  // transformers then rounds the YaRN ramp's ends, and so does titan
  CHECK(titan::gpt_oss::args_from_hf_config(hf).rope_truncate);
  hf["layer_types"][1] = "sliding_attention";
  CHECK_THROWS_WITH(titan::gpt_oss::args_from_hf_config(hf),
                    Catch::Contains("expected layer_types alternating") && Catch::Contains("at block 1"));
  config.model.flavor = "7b";
  CHECK_THROWS_WITH(titan::models::JobArgs<GptOss>::make(config),
                    Catch::Contains("model.flavor") && Catch::Contains("debugmodel"));
}
