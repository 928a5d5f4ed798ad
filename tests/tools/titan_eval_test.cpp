// SPDX-License-Identifier: BSD-3-Clause
// titan-eval against its oracle, lm-eval-harness (the pinned lm_eval, Hugging Face backend, CPU, fp32): the debug
// model as a titan checkpoint, scored in place by titan-eval and, exported by titan-convert to-hf, by lm-eval on
// the same task files (tests/assets/eval: multiple_choice, loglikelihood, loglikelihood_rolling), gives the same
// log-likelihood for every request, the same greedy flags, the same per-document acc/acc_norm/acc_bytes and the
// same metrics; the export carries titan's tokenizer (AutoTokenizer gives the same ids). Under titan-run with FSDP 2
// and with TP 2 it gives one process's scores; bad input is named.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <sstream>

#include "dist/launch_test_util.hpp"
#include "dist/subprocess.hpp"
#include "test_util.hpp"
#include "titan/checkpoint/checkpoint.hpp"
#include "titan/data/tokenizer.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/init.hpp"
#include "tool_run.hpp"

using namespace titan;
namespace fs = std::filesystem;

namespace titan_eval_test {

// Both sides take log-softmax in float64 of float32 logits (lm-eval with softmax_dtype=float64), so the only
// difference is the float32 forward: transformers and titan agree on the debug model's logits (|logit| <~ 1 at
// init) to a few float32 ulps after 6 layers, ~5e-7, and a token's log-probability moves by at most twice its
// logits' largest change. 1e-6 per scored token (1e-5 for requests of up to 10 tokens, every multiple-choice and
// loglikelihood request here) bounds that; a wrong context, window or position moves a token's log-probability
// by ~0.01 to 1.
double ll_tolerance(int64_t scored_tokens) { return 1e-6 * static_cast<double>(std::max<int64_t>(10, scored_tokens)); }
// Metrics are exp/means of those sums over >= 6 documents: |d log ppl| = |sum d ll| / words <= 1e-5.
constexpr double kMetricRelTolerance = 1e-5;
constexpr int64_t kMaxLength = 64;  // the long passage takes 3 rolling windows

// The debug model (torchtitan's init, the tests' 2048-token vocabulary) as a titan checkpoint under dir/checkpoint.
fs::path save_debug_checkpoint(const fs::path& dir) {
  llama3::Llama3Args args = llama3::flavor("debugmodel");
  args.vocab_size = 2048;
  nn::manual_init_seed(7);
  llama3::Llama3 model(args, kMaxLength, at::TensorOptions());
  model.init_weights();
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) names.push_back(item.key());
  checkpoint::State state;
  checkpoint::add_model(state, names, model.unique_parameters(), nullptr);
  const fs::path step = dir / "checkpoint" / "step-1";
  checkpoint::save(step, state, dist::Mesh(), 1);
  return step;
}

std::vector<std::string> eval_args(const fs::path& checkpoint) {
  return {(test::binary_dir() / "bin" / "titan-eval").string(),
          "--checkpoint",
          checkpoint.string(),
          "--model.hf_assets_path",
          test::test_tokenizer().string(),
          "--tasks",
          (test::test_dir() / "assets" / "eval").string(),
          "--max-length",
          std::to_string(kMaxLength),
          "--batch-size",
          "4",
          "--output",
          "jsonl",
          "--samples"};
}

std::string run_ok(const std::vector<std::string>& argv,
                   const std::map<std::string, std::optional<std::string>>& env = {}) {
  test::Subprocess run(argv, env);
  const auto status = run.wait(180);
  INFO(run.output());
  REQUIRE(status);
  REQUIRE(test::exit_code(*status) == 0);
  return run.output();
}

// titan-eval's JSON lines (after its log lines), by task.
std::map<std::string, nlohmann::json> results_of(const std::string& output) {
  std::map<std::string, nlohmann::json> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    const size_t brace = line.find("{\"");
    if (brace == std::string::npos) continue;
    nlohmann::json r = nlohmann::json::parse(line.substr(brace));
    out[r.at("task").get<std::string>()] = r;
  }
  return out;
}

}  // namespace titan_eval_test

using namespace titan_eval_test;

TEST_CASE("titan-eval on a titan checkpoint gives lm-eval's log-likelihoods and metrics on its HF export",
          "[eval][tools][hf][full]") {
  test::TempDir dir;
  const fs::path step = save_debug_checkpoint(dir.path);
  const fs::path hf = dir.path / "hf";
  // The export carries the run's tokenizer (model.hf_assets_path): lm-eval loads the folder as it is.
  const test::ToolRun convert =
      test::run_tool("titan-convert", {"to-hf", "--input", step.string(), "--output", hf.string(),
                                       "--model.hf_assets_path", test::test_tokenizer().string()});
  INFO(convert.output);
  REQUIRE(convert.code == 0);

  const auto titan = results_of(run_ok(eval_args(dir.path / "checkpoint")));
  const fs::path oracle_out = dir.path / "lm_eval.json";
  // lm-eval offline, with the datasets cache in the test's folder.
  run_ok({test::python(), (test::test_dir() / "oracles" / "lm_eval_oracle.py").string(), hf.string(),
          (test::test_dir() / "assets" / "eval").string(), std::to_string(kMaxLength), oracle_out.string(),
          "shakespeare_mc", "shakespeare_lambada", "passages"},
         {{"HF_HOME", (dir.path / "hf_home").string()}, {"HF_DATASETS_OFFLINE", "1"}, {"HF_HUB_OFFLINE", "1"}});
  const nlohmann::json oracle = nlohmann::json::parse(test::read_file(oracle_out));

  // AutoTokenizer.from_pretrained on the export gives titan's ids, and generate() titan's BOS/EOS.
  const auto tokenizer = data::load_tokenizer(test::test_tokenizer());
  const nlohmann::json& encoded = oracle.at("tokenizer");
  CHECK(encoded.at("ids").get<std::vector<int32_t>>() == tokenizer->encode(encoded.at("text").get<std::string>()));
  const auto generation = nlohmann::json::parse(test::read_file(hf / "generation_config.json"));
  CHECK(generation.value("bos_token_id", -1) == tokenizer->bos_id().value_or(-1));
  CHECK(generation.value("eos_token_id", -1) == tokenizer->eos_id().value_or(-1));

  REQUIRE(titan.size() == 3);
  for (const auto& [task, mine] : titan) {
    INFO(task);
    const nlohmann::json& theirs = oracle.at(task);
    REQUIRE(mine.at("docs").size() == theirs.at("docs").size());
    for (size_t d = 0; d < mine.at("docs").size(); ++d) {
      const nlohmann::json& a = mine.at("docs")[d].at("responses");
      const nlohmann::json& b = theirs.at("docs")[d].at("responses");
      INFO("document " << d);
      REQUIRE(a.size() == b.size());
      for (size_t r = 0; r < a.size(); ++r) {
        CHECK(std::abs(a[r][0].get<double>() - b[r][0].get<double>()) <= ll_tolerance(a[r][2].get<int64_t>()));
        CHECK(a[r][1] == b[r][1]);
      }
      // lm-eval's per-document acc, acc_norm and acc_bytes (multiple_choice) and acc (loglikelihood).
      CHECK(mine.at("docs")[d].at("metrics") == theirs.at("docs")[d].at("metrics"));
    }
    // Every metric lm-eval reports, titan reports alike: accuracies exactly (the same argmax of the same scores),
    // perplexities and bits per byte to the bound above.
    for (const auto& [metric, value] : theirs.at("metrics").items()) {
      INFO(metric);
      if (metric.find("perplexity") != std::string::npos && metric.ends_with("_stderr")) continue;  // a bootstrap
      REQUIRE(mine.at("metrics").contains(metric));
      const double want = value.get<double>(), got = mine.at("metrics").at(metric).get<double>();
      if (metric.starts_with("acc")) {
        CHECK(got == want);
      } else {
        CHECK(std::abs(got - want) <= kMetricRelTolerance * std::abs(want));
      }
    }
  }
  // The fixture can tell the normalisations apart: on some document acc_norm (per character) picks another choice
  // than the raw log-likelihood does, so a normalisation dropped or changed shows.
  int differing = 0;
  for (const nlohmann::json& doc : oracle.at("shakespeare_mc").at("docs"))
    differing += doc.at("metrics").at("acc") != doc.at("metrics").at("acc_norm") ? 1 : 0;
  CHECK(differing > 0);
}

TEST_CASE("titan-eval under titan-run with FSDP 2 and with TP 2 gives one process's scores",
          "[eval][tools][launch][full]") {
  test::TempDir dir;
  save_debug_checkpoint(dir.path);
  const std::vector<std::string> args = eval_args(dir.path / "checkpoint");
  const auto one = results_of(run_ok(args));
  for (const std::string degree :
       {"--parallelism.data_parallel_shard_degree", "--parallelism.tensor_parallel_degree"}) {
    INFO(degree);
    std::vector<std::string> argv = {test::titan_run_path(), "--nproc-per-node", "2", "--"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {degree, "2"});
    const std::string output = run_ok(argv, {{"OMP_NUM_THREADS", "1"}});
    CHECK_THAT(output, Catch::Contains(degree.ends_with("shard_degree") ? "FSDP" : "TP(tp=2"));
    const auto two = results_of(output);
    REQUIRE(two.size() == one.size());
    for (const auto& [task, r] : one) {
      INFO(task);
      const nlohmann::json& a = r.at("docs");
      const nlohmann::json& b = two.at(task).at("docs");
      REQUIRE(a.size() == b.size());
      for (size_t d = 0; d < a.size(); ++d) {
        for (size_t i = 0; i < a[d].at("responses").size(); ++i) {
          // The same float32 function with sums split over ranks (TP) or gathered weights (FSDP): ~1e-7 apart.
          const double ll = a[d].at("responses")[i][0].get<double>();
          CHECK(std::abs(b[d].at("responses")[i][0].get<double>() - ll) <= 1e-5);
        }
      }
      for (const auto& [metric, value] : r.at("metrics").items()) {
        if (metric.starts_with("acc")) CHECK(two.at(task).at("metrics").at(metric) == value);
      }
    }
  }
}

TEST_CASE("titan-eval names a missing task file, an unknown metric and a checkpoint of another model",
          "[eval][tools][errors][full]") {
  test::TempDir dir;
  save_debug_checkpoint(dir.path);
  const fs::path tasks = dir.path / "tasks";
  fs::create_directories(tasks);
  test::write_file(tasks / "bad_metric.yaml",
                   "task: bad\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: rows.jsonl\n"
                   "test_split: test\noutput_type: multiple_choice\ndoc_to_text: q\ndoc_to_choice: c\n"
                   "doc_to_target: a\nmetric_list:\n  - metric: f1\n");
  const std::string checkpoint = (dir.path / "checkpoint").string();
  const std::string missing = (tasks / "missing.yaml").string();
  for (const auto& [extra, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--tasks", missing}, "expected the task file '" + missing + "' to be a readable file"},
           {{"--tasks", (tasks / "bad_metric.yaml").string()},
            "bad_metric.yaml: metric_list: expected a metric of multiple_choice tasks (acc, acc_norm, acc_bytes), got "
            "'f1'"},
           // The checkpoint holds Llama 3's debug model, not Qwen3's.
           {{"--text", test::tinyshakespeare().string(), "--model.name", "qwen3"},
            "The checkpoint is of another model or flavor"},
           {{}, "expected at least one --tasks FILE|DIR or --text FILE"}}) {
    std::vector<std::string> argv = {(test::binary_dir() / "bin" / "titan-eval").string(), "--checkpoint", checkpoint,
                                     "--model.hf_assets_path", test::test_tokenizer().string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    test::Subprocess run(argv, {});
    const auto status = run.wait(120);
    INFO(run.output());
    REQUIRE(status);
    CHECK(test::exit_code(*status) == 1);
    CHECK_THAT(run.output(), Catch::Contains(expected));
  }
}

TEST_CASE("evaluation every eval.interval steps logs titan-eval's metrics of that step's checkpoint",
          "[eval][tools][train][full]") {
  // One process, TP 2 (sequence and loss parallel: vocab-sharded logits gathered) and FSDP 2 (batches split).
  const std::string layout =
      GENERATE("one process", "--parallelism.tensor_parallel_degree", "--parallelism.data_parallel_shard_degree");
  INFO(layout);
  test::TempDir dir;
  const std::string tasks = (test::test_dir() / "assets" / "eval").string();
  std::vector<std::string> argv = test::concat(test::debug_trainer(dir.path, /*steps=*/2, /*local_batch=*/2),
                                               {"--eval.interval", "2", "--eval.tasks", tasks, "--eval.limit", "6",
                                                "--checkpoint.enable", "true", "--checkpoint.interval", "2"});
  if (layout != "one process") {
    argv = test::concat({test::titan_run_path(), "--nproc-per-node", "2", "--"}, argv);
    argv.insert(argv.end(), {layout, "2"});
  }
  run_ok(argv);
  nlohmann::json logged;
  std::istringstream lines(test::read_file(dir.path / "metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("eval/shakespeare_mc/acc")) logged = record;
  }
  REQUIRE(logged.value("step", 0) == 2);

  std::vector<std::string> args = eval_args(dir.path / "checkpoint");
  args.insert(args.end(), {"--limit", "6", "--max-length", "32"});  // eval.max_length 0: training.seq_len, 32
  const auto offline = results_of(run_ok(args));
  REQUIRE(offline.size() == 3);
  int compared = 0;
  for (const auto& [task, r] : offline) {
    for (const auto& [metric, value] : r.at("metrics").items()) {
      INFO(task << " " << metric);
      const std::string key = fmt::format("eval/{}/{}", task, metric);
      REQUIRE(logged.contains(key));
      const double want = value.get<double>(), got = logged.at(key).get<double>();
      // The same weights and requests; TP and FSDP reorder float32 sums (~1e-7 per token, as above).
      if (metric.starts_with("acc")) {
        CHECK(got == want);
      } else {
        CHECK(std::abs(got - want) <= kMetricRelTolerance * std::abs(want));
      }
      ++compared;
    }
  }
  CHECK(compared >= 10);
}
