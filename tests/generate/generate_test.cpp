// SPDX-License-Identifier: BSD-3-Clause
// Generation with a KV cache: greedy titan-generate on a small random Llama exported to Hugging Face
// format, and on random Qwen3, Qwen3-MoE, DeepSeek-V3, gpt-oss and Qwen3.5-MoE models made by transformers, gives
// transformers' generate(do_sample=False) tokens; every cached step's logits equal a
// full recompute without a cache (left-padded prompts of different lengths in one batch); TP 2 under
// titan-run gives one process's tokens; a seed reproduces a sampled run and another seed changes it.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sstream>

#include "dist/launch_test_util.hpp"
#include "test_util.hpp"
#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/llama3/hf_adapter.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/generate.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/kv_cache.hpp"
#include "titan/nn/sampling.hpp"

using namespace titan;
namespace fs = std::filesystem;

namespace {

// Logits of the same fp32 function through the cache (masked SDPA over cached K/V, one token per
// step) and through forward() (causal SDPA over the whole sequence): ~1e-6 apart at logits of size
// ~1; a wrong position, mask or cache column moves them by 0.1 or more.
constexpr double kLogitTolerance = 1e-4;

// A small Llama (vocab of the tests' tokenizer) with weights large enough that its greedy choices
// are decided by clear margins, not by rounding: norms around 1, matrices N(0, 0.08^2).
llama3::Llama3Args small_args() {
  return {.dim = 64,
          .n_layers = 2,
          .n_heads = 4,
          .n_kv_heads = 2,
          .vocab_size = 2048,
          .multiple_of = 32,
          .rope_theta = 10000.0};
}

std::shared_ptr<llama3::Llama3> random_model(const llama3::Llama3Args& args, int64_t seq_len, uint64_t seed) {
  auto model = std::make_shared<llama3::Llama3>(args, seq_len, at::TensorOptions());
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& p : model->parameters()) {
    const at::Tensor noise = at::randn(p.sizes(), gen);  // p's shape
    p.copy_(p.dim() == 1 ? 1.0 + 0.3 * noise : 0.08 * noise);
  }
  return model;
}

std::vector<std::pair<std::string, at::Tensor>> whole_tensors(const llama3::Llama3& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value().detach());
  return out;
}

std::string generate_path() { return (test::binary_dir() / "bin" / "titan-generate").string(); }

const std::vector<std::string> kPrompts = {"ROMEO:", "First Citizen:\nBefore we proceed any further, hear me",
                                           "What light through yonder"};

std::vector<std::string> prompt_args() {
  std::vector<std::string> args;
  for (const auto& p : kPrompts) args.insert(args.end(), {"--prompt", p});
  return args;
}

// Runs a program; its output (titan-run prefixes every line with "[rank R] ").
std::string run_ok(const std::vector<std::string>& argv, double seconds = 120) {
  test::Subprocess run(argv, {{"OMP_NUM_THREADS", "1"}, {"TITAN_LOG_LEVEL", "info"}});
  const auto status = run.wait(seconds);
  INFO(run.output());
  REQUIRE(status);
  REQUIRE(test::exit_code(*status) == 0);
  return run.output();
}

// The JSON lines of titan-generate --output jsonl in a program's output.
std::vector<nlohmann::json> json_lines(const std::string& output) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    const size_t brace = line.find("{\"");
    if (brace != std::string::npos) rows.push_back(nlohmann::json::parse(line.substr(brace)));
  }
  return rows;
}

std::vector<std::vector<int64_t>> ids_of(const std::vector<nlohmann::json>& rows) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& r : rows) out.push_back(r.at("ids").get<std::vector<int64_t>>());
  return out;
}

nn::CachedForward cached(const llama3::Llama3& model) {
  return [&model](const at::Tensor& tokens, nn::KVCache& cache) { return model.forward_cached(tokens, cache); };
}

}  // namespace

TEST_CASE("greedy titan-generate on a titan model exported to HF equals transformers' generate",
          "[generate][hf][full]") {
  test::TempDir dir;
  const llama3::Llama3Args args = small_args();
  const auto model = random_model(args, 64, 7);
  const fs::path hf = dir.path / "hf";
  checkpoint::save_hf(hf, whole_tensors(*model), *llama3::hf_adapter(args), at::kFloat);

  constexpr int kNewTokens = 64;
  std::vector<std::string> argv = {generate_path(),
                                   "--checkpoint",
                                   hf.string(),
                                   "--model.hf_assets_path",
                                   test::test_tokenizer().string(),
                                   "--max-new-tokens",
                                   std::to_string(kNewTokens),
                                   "--greedy",
                                   "--output",
                                   "jsonl"};
  const auto prompts = prompt_args();
  argv.insert(argv.end(), prompts.begin(), prompts.end());
  const std::string output = run_ok(argv);
  const auto rows = json_lines(output);
  REQUIRE(rows.size() == kPrompts.size());
  {
    // stdout alone holds the JSON lines and nothing else (the log goes to stderr), as a pipe reads them.
    std::string command = "OMP_NUM_THREADS=1 TITAN_LOG_LEVEL=info";
    for (const auto& a : argv) command += fmt::format(" \"{}\"", a);
    const fs::path stdout_file = dir.path / "stdout.jsonl";
    REQUIRE(std::system(fmt::format("{} > \"{}\" 2>/dev/null", command, stdout_file.string()).c_str()) == 0);
    std::istringstream lines(test::read_file(stdout_file));
    std::vector<nlohmann::json> alone;
    for (std::string line; std::getline(lines, line);) {
      INFO("stdout line: " << line);
      REQUIRE(nlohmann::json::accept(line));
      alone.push_back(nlohmann::json::parse(line));
    }
    CHECK(alone == rows);
  }
  const fs::path titan_file = dir.path / "titan.jsonl", oracle_file = dir.path / "hf.json";
  {
    std::ofstream out(titan_file);
    for (const auto& r : rows) out << r.dump() << "\n";
  }
  REQUIRE(test::run_python("hf_generate.py", fmt::format("\"{}\" \"{}\" \"{}\" {}", hf.string(), titan_file.string(),
                                                         oracle_file.string(), kNewTokens)) == 0);
  const auto expected = nlohmann::json::parse(test::read_file(oracle_file)).get<std::vector<std::vector<int64_t>>>();
  const auto got = ids_of(rows);
  INFO(output);
  REQUIRE(got.size() == expected.size());
  for (size_t b = 0; b < got.size(); ++b) {
    INFO("prompt " << b << ": " << kPrompts[b]);
    CHECK(rows[b].at("prompt_ids").size() > 1);  // BOS + the prompt's tokens
    CHECK(got[b] == expected[b]);
    // Either all 64 tokens, or stopped at the first EOS.
    const int64_t eos = rows[b].at("eos_id").get<int64_t>();
    CHECK((got[b].size() == kNewTokens || (!got[b].empty() && got[b].back() == eos)));
  }
}

TEST_CASE(
    "greedy titan-generate on HF Qwen3-MoE (a dense block among them), DeepSeek-V3, gpt-oss and Qwen3.5-MoE models "
    "equals transformers' generate",
    "[generate][hf][slow]") {
  // transformers makes each random model (norms around 1, matrices N(0, 0.08^2): greedy choices by clear
  // margins); titan-generate picks the family by the config's architectures and decodes through its
  // attention's KV-cache forward (DeepSeek-V3's latent attention caches every head's keys and values;
  // gpt-oss's blocks 0 and 2 slide over 5 tokens, so prompt + 20 new tokens run far past the window, with sinks).
  struct Family {
    const char* oracle;
    const char* flags;
  };
  // Qwen3-MoE's oracle model keeps block 1 dense (mlp_only_layers): dense Qwen3 blocks and q/k norms are in it.
  // Qwen3.5-MoE's: three Gated DeltaNet blocks (their convolution and delta-rule state carried by the cache, the
  // left padding of the shorter prompts kept out of it) around a gated full-attention block.
  const Family family = GENERATE(Family{"qwen3_oracle.py", " --moe"}, Family{"hf_deepseek_v3.py", " --q-lora"},
                                 Family{"hf_gpt_oss.py", ""}, Family{"qwen3_5_oracle.py", " --moe"});
  INFO(family.oracle << family.flags);
  test::TempDir dir;
  const fs::path hf = dir.path / "hf";
  REQUIRE(test::run_python(family.oracle, fmt::format("make \"{}\" \"{}\"{}", hf.string(),
                                                      (dir.path / "oracle.safetensors").string(), family.flags)) == 0);
  constexpr int kNewTokens = 20;  // DeepSeek-V3's oracle model holds 32 positions
  const std::string output =
      run_ok({generate_path(), "--checkpoint", hf.string(), "--max-new-tokens", std::to_string(kNewTokens), "--greedy",
              "--output", "jsonl", "--prompt-ids", "5,17,3,42,8", "--prompt-ids", "60,2", "--prompt-ids", "11"});
  const auto rows = json_lines(output);
  REQUIRE(rows.size() == 3);
  const fs::path titan_file = dir.path / "titan.jsonl", oracle_file = dir.path / "hf.json";
  {
    std::ofstream out(titan_file);
    for (const auto& r : rows) out << r.dump() << "\n";
  }
  REQUIRE(test::run_python("hf_generate.py", fmt::format("\"{}\" \"{}\" \"{}\" {}", hf.string(), titan_file.string(),
                                                         oracle_file.string(), kNewTokens)) == 0);
  const auto expected = nlohmann::json::parse(test::read_file(oracle_file)).get<std::vector<std::vector<int64_t>>>();
  INFO(output);
  CHECK(ids_of(rows) == expected);
  for (const auto& ids : ids_of(rows)) CHECK(ids.size() == kNewTokens);  // no EOS without a tokenizer
}

TEST_CASE("each KV-cache decoding step's logits equal a full recompute without a cache", "[generate][kv_cache]") {
  const llama3::Llama3Args args = small_args();
  const auto model = random_model(args, 64, 11);
  // Three prompts of different lengths in one left-padded batch (one of a single token).
  const at::Tensor ids = at::randint(args.vocab_size, {32}, at::make_generator<at::CPUGeneratorImpl>(5), at::kLong);
  auto slice = [&](int64_t begin, int64_t len) {
    std::vector<int64_t> p(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) p[static_cast<size_t>(i)] = ids[begin + i].item<int64_t>();
    return p;
  };
  const std::vector<std::vector<int64_t>> prompts = {slice(0, 7), slice(7, 13), slice(20, 1)};
  const bool greedy = GENERATE(true, false);
  INFO((greedy ? "greedy" : "sampled at temperature 1"));
  const nn::Generation out = nn::generate(
      cached(*model), args.n_layers, prompts,
      {.max_new_tokens = 16, .sampling = {.temperature = greedy ? 0.0 : 1.0}, .seed = 3, .keep_logits = true});
  REQUIRE(out.logits.size() == 16);
  at::NoGradGuard no_grad;
  double worst = 0.0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    REQUIRE(out.tokens[b].size() == 16);
    std::vector<int64_t> sequence = prompts[b];
    for (size_t step = 0; step < out.logits.size(); ++step) {
      const at::Tensor full = model->forward(at::tensor(sequence, at::kLong).unsqueeze(0));  // (1, S, V)
      const at::Tensor want = full[0][-1];                                                   // (V)
      const at::Tensor got = out.logits[step][static_cast<int64_t>(b)];                      // (V)
      worst = std::max(worst, (got - want).abs().max().item<double>());
      if (greedy) CHECK(want.argmax().item<int64_t>() == out.tokens[b][step]);
      sequence.push_back(out.tokens[b][step]);
    }
  }
  INFO("largest logit difference " << worst);
  CHECK(worst < kLogitTolerance);

  // The same decode with no padding (each prompt alone) gives the same tokens.
  if (greedy) {
    for (size_t b = 0; b < prompts.size(); ++b) {
      const nn::Generation alone = nn::generate(cached(*model), args.n_layers, {prompts[b]}, {.max_new_tokens = 16});
      CHECK(alone.tokens[0] == out.tokens[b]);
    }
  }
}

TEST_CASE("titan-generate under titan-run with TP 2 gives one process's tokens", "[generate][tp][launch][full]") {
  test::TempDir dir;
  // A titan checkpoint of the debug model (torchtitan's init) with the tests' 2048-token vocabulary.
  llama3::Llama3Args args = llama3::flavor("debugmodel");
  args.vocab_size = 2048;
  nn::manual_init_seed(21);
  llama3::Llama3 model(args, 64, at::TensorOptions());
  model.init_weights();
  const std::vector<at::Tensor> params = model.unique_parameters();
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) names.push_back(item.key());
  checkpoint::State state;
  checkpoint::add_model(state, names, params, nullptr);
  const fs::path step = dir.path / "checkpoint" / "step-5";
  checkpoint::save(step, state, dist::Mesh(), 5);

  const std::string sampling = GENERATE("--greedy", "--temperature=0.8");
  INFO(sampling);
  std::vector<std::string> argv = {generate_path(),
                                   "--checkpoint",
                                   (dir.path / "checkpoint").string(),
                                   "--model.flavor",
                                   "debugmodel",
                                   "--model.hf_assets_path",
                                   test::test_tokenizer().string(),
                                   "--max-new-tokens",
                                   "24",
                                   "--debug.seed",
                                   "9",
                                   "--top-k",
                                   "40",
                                   "--output",
                                   "jsonl"};
  if (sampling == "--greedy") {
    argv.push_back("--greedy");
  } else {
    argv.insert(argv.end(), {"--temperature", "0.8"});
  }
  const auto prompts = prompt_args();
  argv.insert(argv.end(), prompts.begin(), prompts.end());
  const auto one = ids_of(json_lines(run_ok(argv)));
  std::vector<std::string> tp = {test::titan_run_path(), "--nproc-per-node", "2", "--"};
  tp.insert(tp.end(), argv.begin(), argv.end());
  tp.insert(tp.end(), {"--parallelism.tensor_parallel_degree", "2"});
  const std::string tp_output = run_ok(tp);
  const auto two = ids_of(json_lines(tp_output));
  INFO(tp_output);
  REQUIRE(one.size() == kPrompts.size());
  CHECK(two == one);
  CHECK(tp_output.find("TP(tp=2") != std::string::npos);
}

TEST_CASE("sampling with a seed is reproducible and another seed changes it", "[generate][sampling]") {
  const at::Tensor logits =
      at::randn({4, 300}, at::make_generator<at::CPUGeneratorImpl>(1)) * 2.0;  // (B, V): broad distributions
  auto draws = [&](const nn::SamplingConfig& config, uint64_t seed) {
    at::Generator gen = nn::sampling_generator(seed);
    std::vector<at::Tensor> out;
    for (int i = 0; i < 8; ++i) out.push_back(nn::sample(logits, config, gen));  // (B) each
    return at::stack(out);                                                       // (8, B)
  };
  const nn::SamplingConfig warm{.temperature = 1.0};
  CHECK(at::equal(draws(warm, 4), draws(warm, 4)));
  CHECK(!at::equal(draws(warm, 4), draws(warm, 5)));
  // Greedy is the argmax; top-k 1 and a tiny top-p leave only it.
  const at::Tensor argmax = logits.argmax(-1);  // (B)
  at::Generator unused = nn::sampling_generator(0);
  CHECK(at::equal(nn::sample(logits, {}, unused), argmax));
  CHECK(at::equal(draws({.temperature = 1.0, .top_k = 1}, 4), argmax.expand({8, 4})));
  CHECK(at::equal(draws({.temperature = 1.0, .top_p = 1e-6}, 4), argmax.expand({8, 4})));
  // Top-k 5 draws only among each row's 5 largest logits.
  const at::Tensor top5 = std::get<1>(logits.topk(5, -1));              // (B, 5)
  const at::Tensor drawn = draws({.temperature = 1.5, .top_k = 5}, 8);  // (8, B)
  CHECK((drawn.t().unsqueeze(-1) == top5.unsqueeze(1)).any(-1).all().item<bool>());

  // A whole sampled generation: same seed, same tokens; another seed, others.
  const llama3::Llama3Args args = small_args();
  const auto model = random_model(args, 64, 13);
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {4, 5}};
  auto run = [&](uint64_t seed) {
    return nn::generate(cached(*model), args.n_layers, prompts,
                        {.max_new_tokens = 20, .sampling = {.temperature = 1.0, .top_p = 0.9}, .seed = seed})
        .tokens;
  };
  CHECK(run(1) == run(1));
  CHECK(run(1) != run(2));

  // Out-of-range settings name the flag.
  CHECK_THAT(test::error_of([&] { draws({.temperature = -1.0}, 0); }), Catch::Contains("--temperature"));
  CHECK_THAT(test::error_of([&] { draws({.temperature = 1.0, .top_p = 0.0}, 0); }), Catch::Contains("--top-p"));
}

TEST_CASE("titan-generate names a bad flag and a missing checkpoint", "[generate][errors][full]") {
  test::TempDir dir;
  const fs::path missing = dir.path / "no-such-checkpoint";
  const std::string checkpoint = missing.string();
  for (const auto& [argv, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{generate_path(), "--checkpoint", checkpoint, "--prompt", "x"}, checkpoint},
           {{generate_path(), "--checkpoint", checkpoint, "--prompt", "x", "--top-p", "1.5"}, "--top-p"},
           {{generate_path(), "--checkpoint", checkpoint, "--max-new-tokens", "many"}, "--max-new-tokens"},
           // A count below 1 is named as such, not blamed on the sequence length it would make.
           {{generate_path(), "--checkpoint", checkpoint, "--prompt", "x", "--max-new-tokens", "-3"},
            "[titan-generate] expected --max-new-tokens >= 1, got -3."},
           {{generate_path(), "--checkpoint", checkpoint, "--prompt", "x", "--max-new-tokens", "0"},
            "expected --max-new-tokens >= 1, got 0."},
           // No --checkpoint: the job's <job.dump_folder>/<checkpoint.folder>, named when it is missing.
           {{generate_path(), "--prompt", "x", "--job.dump_folder", checkpoint}, "--checkpoint (default: "},
           {{generate_path(), "--prompt", "x", "--job.dump_folder", checkpoint}, checkpoint + "/checkpoint'"},
           // Flags a config key replaced name the key.
           {{generate_path(), "--checkpoint", checkpoint, "--prompt", "x", "--tp", "2"},
            "expected --parallelism.tensor_parallel_degree N (the trainer's config key), got --tp"},
           {{generate_path(), "--checkpoint", checkpoint, "--prompt", "x", "--seed", "2"}, "--debug.seed"},
           {{generate_path(), "--checkpoint", checkpoint, "--prompt", "x", "--tokenizer", "t"},
            "--model.hf_assets_path"},
           // Self-speculative decoding checks its drafts against the argmax: sampling is refused by name.
           {{generate_path(), "--checkpoint", checkpoint, "--prompt", "x", "--speculative-mtp", "--temperature", "0.7"},
            "expected greedy decoding with --speculative-mtp"}}) {
    test::Subprocess run(argv, {});
    const auto status = run.wait(60);
    INFO(run.output());
    REQUIRE(status);
    CHECK(test::exit_code(*status) == 1);
    CHECK_THAT(run.output(), Catch::Contains(expected));
    CHECK_THAT(run.output(), !Catch::Contains("seq_len"));
  }
}
