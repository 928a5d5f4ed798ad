// SPDX-License-Identifier: BSD-3-Clause
// DeepSeek-V3 against Hugging Face transformers' DeepseekV3ForCausalLM (the oracle, fp32, eager
// attention): random small HF models load into titan with the same logits (full-rank and low-rank
// queries, interleaved and rotate-half RoPE layouts, YaRN and plain RoPE), and titan's export of one
// gives back the original tensors and, loaded by transformers, titan's logits.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpoint/convert_round_trip.hpp"
#include "test_util.hpp"
#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/models/deepseek_v3/hf_adapter.hpp"
#include "titan/models/deepseek_v3/model.hpp"

using namespace titan;
namespace fs = std::filesystem;

namespace {

// transformers and titan compute the same fp32 function with different kernels (eager softmax vs
// SDPA, rotate-half vs pairwise RoPE, a per-expert loop vs grouped GEMM): agreement to ~1e-6 of
// logits of size ~1-10; 1e-4 absolute leaves margin and still catches a misplaced row or a wrong
// routing choice (errors of ~0.1+).
constexpr double kDeepseekHfLogitTolerance = 1e-4;

// Parameters and the MoE expert biases (HF's e_score_correction_bias), as the checkpoint state.
checkpoint::State model_state(deepseek_v3::DeepSeekV3& model) {
  checkpoint::State state;
  for (const auto& item : model.named_parameters()) {
    state.tensors.push_back(checkpoint::state_tensor("model." + item.key(), item.value(), nullptr));
  }
  for (const auto& item : model.named_buffers()) {
    state.tensors.push_back(checkpoint::state_tensor("model." + item.key(), item.value(), nullptr));
  }
  return state;
}

at::Tensor titan_logits(const deepseek_v3::DeepSeekV3& model, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  return model.forward(tokens).to(at::kFloat);  // (B, S, V)
}

struct Loaded {
  std::shared_ptr<deepseek_v3::DeepSeekV3> model{};
  at::Tensor tokens{};  // (B, S)
  at::Tensor logits{};  // (B, S, V): transformers'
};

// transformers saves a random model with `flags`; titan loads it.
Loaded load_random_hf(const fs::path& dir, const std::string& flags) {
  const fs::path hf = dir / "hf", oracle = dir / "oracle.safetensors";
  REQUIRE(test::run_python("hf_deepseek_v3.py",
                           fmt::format("make \"{}\" \"{}\" {}", hf.string(), oracle.string(), flags)) == 0);
  const checkpoint::SafetensorsFile expected(oracle);
  const checkpoint::HfReader reader(hf);
  const deepseek_v3::DeepSeekV3Args args = deepseek_v3::args_from_hf_config(reader.config());
  Loaded out{.model = nullptr, .tokens = expected.read("tokens"), .logits = expected.read("logits")};
  out.model = std::make_shared<deepseek_v3::DeepSeekV3>(args, out.tokens.size(1), at::TensorOptions());
  checkpoint::State state = model_state(*out.model);
  const bool interleave = reader.config().value("rope_interleave", true);
  checkpoint::load_hf(hf, state, *deepseek_v3::hf_adapter(args, *args.yarn, interleave));
  return out;
}

}  // namespace

TEST_CASE(
    "an HF DeepSeek-V3 with full-rank q and interleaved RoPE without YaRN loads into titan with the same logits "
    "and titan-convert round-trips it",
    "[models][deepseek_v3][hf][full]") {
  test::TempDir dir;
  const Loaded loaded = load_random_hf(dir.path, "--no-yarn");
  CHECK_FALSE(*loaded.model->args().yarn);
  CHECK(loaded.model->args().q_lora_rank == 0);
  CHECK((titan_logits(*loaded.model, loaded.tokens) - loaded.logits).abs().max().item<double>() <
        kDeepseekHfLogitTolerance);
  test::check_convert_round_trip(dir.path / "hf", dir.path);  // e_score_correction_bias included
}

TEST_CASE("an HF DeepSeek-V3 with low-rank q and rotate-half RoPE and YaRN round-trips through titan",
          "[models][deepseek_v3][hf][full]") {
  test::TempDir dir;
  const Loaded loaded = load_random_hf(dir.path, "--q-lora --half-rope");
  const deepseek_v3::DeepSeekV3Args& args = loaded.model->args();
  CHECK(*args.yarn);
  CHECK(args.q_lora_rank == 24);
  CHECK(args.moe.num_expert_groups == 2);
  const at::Tensor logits = titan_logits(*loaded.model, loaded.tokens);
  CHECK((logits - loaded.logits).abs().max().item<double>() < kDeepseekHfLogitTolerance);

  // Export in the source's layout: the same tensor names and values as transformers wrote.
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : loaded.model->named_parameters()) tensors.emplace_back(item.key(), item.value());
  for (const auto& item : loaded.model->named_buffers()) tensors.emplace_back(item.key(), item.value());
  const fs::path same = dir.path / "same";
  checkpoint::save_hf(same, tensors, *deepseek_v3::hf_adapter(args, true, /*rope_interleave=*/false), at::kFloat);
  const checkpoint::HfReader original(dir.path / "hf"), round_trip(same);
  CHECK(round_trip.names() == original.names());
  for (const auto& name : original.names()) {
    INFO(name);
    CHECK(at::equal(round_trip.read(name), original.read(name)));
  }

  // titan's own export (interleaved, as DeepSeek's checkpoints): transformers computes titan's logits.
  const fs::path exported = dir.path / "exported";
  checkpoint::save_hf(exported, tensors, *loaded.model->hf_adapter(), at::kFloat);
  const fs::path tokens_file = dir.path / "tokens.safetensors", out = dir.path / "hf_logits.safetensors";
  checkpoint::write_safetensors(tokens_file, {{"tokens", loaded.tokens}});
  REQUIRE(test::run_python("hf_deepseek_v3.py", fmt::format("logits \"{}\" \"{}\" \"{}\"", exported.string(),
                                                            tokens_file.string(), out.string())) == 0);
  CHECK((checkpoint::SafetensorsFile(out).read("logits") - logits).abs().max().item<double>() <
        kDeepseekHfLogitTolerance);
}

TEST_CASE("deepseek_v3 refuses an HF export transformers cannot express", "[models][deepseek_v3][hf][errors]") {
  const deepseek_v3::DeepSeekV3Args debug = deepseek_v3::flavor("debugmodel");  // softmax routing
  CHECK_THROWS_WITH(deepseek_v3::hf_adapter(debug, false)->hf_config(at::kFloat),
                    Catch::Contains("sigmoid") && Catch::Contains("softmax"));
  const nlohmann::json config = deepseek_v3::hf_adapter(deepseek_v3::flavor("671B"), true)->hf_config(at::kBFloat16);
  CHECK(config["first_k_dense_replace"] == 3);
  CHECK(config["rope_parameters"]["rope_type"] == "yarn");
  CHECK(config["q_lora_rank"] == 1536);
}
