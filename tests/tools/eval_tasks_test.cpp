// SPDX-License-Identifier: BSD-3-Clause
// titan-eval's library part alone (include/titan/eval): lm-eval task YAMLs read into documents, the errors that
// name a file, key or line, rolling windows as lm-eval cuts them, lm-eval's word and character counts, the
// normalisations of acc_norm (characters) and acc_bytes (UTF-8 bytes), and scoring through a model whose
// log-probabilities are known.
#include <ATen/ATen.h>

#include <cmath>

#include "test_util.hpp"
#include "titan/eval/metrics.hpp"
#include "titan/eval/requests.hpp"
#include "titan/eval/scoring.hpp"
#include "titan/eval/task.hpp"

using namespace titan;
namespace fs = std::filesystem;

namespace eval_tasks_test {

fs::path asset(const std::string& name) { return test::test_dir() / "assets" / "eval" / name; }

// A task folder with one YAML (body) over a two-row data file.
fs::path write_task(const test::TempDir& dir, const std::string& body) {
  test::write_file(dir.path / "rows.jsonl",
                   "{\"q\": \"Is it?\", \"c\": [\"yes\", \"no\"], \"a\": 1, \"m\": {\"t\": [\"x\", \"y\"]}}\n"
                   "{\"q\": \"Or not?\", \"c\": [\"maybe\", \"so\"], \"a\": \"so\", \"m\": {\"t\": [\"z\", \"w\"]}}\n");
  const fs::path yaml = dir.path / "task.yaml";
  test::write_file(yaml,
                   "task: t\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: rows.jsonl\n"
                   "test_split: test\n" +
                       body);
  return yaml;
}

}  // namespace eval_tasks_test

using namespace eval_tasks_test;

TEST_CASE("the shipped task files read into lm-eval's documents", "[eval]") {
  const eval::Task mc = eval::read_task(asset("shakespeare_mc.yaml"));
  CHECK(mc.name == "shakespeare_mc");
  CHECK(mc.output_type == eval::OutputType::multiple_choice);
  REQUIRE(mc.docs.size() == 24);
  // description + doc_to_text; the choices of the list field; the index of doc_to_target.
  CHECK(mc.docs[1].context == "Complete the famous line.\nQuestion: The sun rises in the\nAnswer:");
  CHECK(mc.docs[1].choices == std::vector<std::string>{"west", "middle of the night sky", "sea", "east"});
  CHECK(mc.docs[1].gold == 3);
  CHECK(mc.metrics == std::vector<std::string>{"acc", "acc_norm", "acc_bytes"});

  const eval::Task lambada = eval::read_task(asset("shakespeare_lambada.yaml"));
  REQUIRE(lambada.docs.size() == 12);
  CHECK(lambada.docs[0].context == "But, soft! what light through yonder window");
  CHECK(lambada.docs[0].target == " breaks");
  CHECK(lambada.metrics == std::vector<std::string>{"perplexity", "acc"});

  const eval::Task passages = eval::read_task(asset("passages.yaml"));
  REQUIRE(passages.docs.size() == 6);
  CHECK(passages.docs[1].target == "Night fell.\n");
  CHECK(passages.docs[1].context.empty());
}

TEST_CASE("task YAML: templates, field names, YAML lists and lm-eval's defaults", "[eval]") {
  test::TempDir dir;
  // A field name reads the field; {{ m.t }} a nested list; a string target is the choice it names; no metric_list
  // means lm-eval's defaults for the type.
  eval::Task t = eval::read_task(write_task(dir,
                                            "output_type: multiple_choice\ndoc_to_text: \"Q: {{ q }}\"  # c\n"
                                            "doc_to_choice: \"{{ m.t }}\"\ndoc_to_target: a\n"
                                            "target_delimiter: ''\n"));
  CHECK(t.docs[0].context == "Q: Is it?");
  CHECK(t.docs[0].choices == std::vector<std::string>{"x", "y"});
  CHECK(t.docs[0].gold == 1);
  CHECK(t.docs[1].gold == -1);  // "so" is not among z, w: scored wrong, as lm-eval's -100
  CHECK(t.target_delimiter.empty());
  CHECK(t.metrics == std::vector<std::string>{"acc", "acc_norm"});
  // A YAML list of choices, and a target given by the text of a choice.
  t = eval::read_task(write_task(dir,
                                 "output_type: multiple_choice\ndoc_to_text: q\n"
                                 "doc_to_choice: ['maybe', \"so\"]\ndoc_to_target: \"{{a}}\"\n"));
  CHECK(t.docs[1].choices == std::vector<std::string>{"maybe", "so"});
  CHECK(t.docs[1].gold == 1);
  CHECK(t.docs[0].gold == 1);  // "1" rendered is all digits: an index, as lm-eval's literal_eval makes it
  t = eval::read_task(write_task(dir,
                                 "output_type: loglikelihood\ndoc_to_text: \"{{c[0]}} and {{ m['t'][1] }}\"\n"
                                 "doc_to_target: q\n"));
  CHECK(t.docs[0].context == "yes and y");
  CHECK(t.docs[0].target == "Is it?");
}

TEST_CASE("task YAML errors name the file, the key or line, and what to do", "[eval]") {
  test::TempDir dir;
  const std::string mc = "output_type: multiple_choice\ndoc_to_text: q\ndoc_to_choice: c\ndoc_to_target: a\n";
  for (const auto& [body, expected] : std::vector<std::pair<std::string, std::string>>{
           {mc + "process_docs: !function utils.process\n",
            "task.yaml:11: expected no anchors, aliases or tags (lm-eval's !function"},
           {mc + "filter_list: []\n", "got 'filter_list'"},
           {mc + "metric_list:\n  - metric: mcc\n", "metric_list: expected a metric of multiple_choice tasks"},
           {mc + "metric_list:\n  - metric: acc\n    aggregation: median\n", "expected acc's aggregation mean"},
           {mc + "num_fewshot: 5\n", "num_fewshot: expected 0"},
           {"output_type: generate_until\ndoc_to_target: a\n", "which titan-eval does not run"},
           {"output_type: loglikelihood\ndoc_to_text: \"{{ q | upper }}\"\ndoc_to_target: a\n",
            "doc_to_text: expected Jinja of the form"},
           {"output_type: loglikelihood\ndoc_to_text: \"{{ missing }}\"\ndoc_to_target: q\n",
            "doc_to_text: expected the document to have 'missing'"},
           {"output_type: loglikelihood\ndoc_to_text: |\n  text\ndoc_to_target: q\n",
            "task.yaml:8: expected a one-line value"},
           {"output_type: loglikelihood\ndoc_to_text: q\n\tdoc_to_target: q\n",
            "task.yaml:9: expected indentation by spaces"},
       }) {
    INFO(body);
    const fs::path yaml = write_task(dir, body);
    const std::string error = test::error_of([&] { eval::read_task(yaml); });
    CHECK_THAT(error, Catch::Contains(yaml.string()) && Catch::Contains(expected));
  }
  // The data file a task names must be there; the message names it.
  test::write_file(dir.path / "other.yaml",
                   "task: o\ndataset_path: json\ndataset_kwargs:\n  data_files: gone.jsonl\n"
                   "test_split: train\noutput_type: loglikelihood\ndoc_to_target: q\n");
  CHECK_THAT(test::error_of([&] { eval::read_task(dir.path / "other.yaml"); }),
             Catch::Contains((dir.path / "gone.jsonl").string()) && Catch::Contains("readable file"));
  CHECK_THAT(test::error_of([&] { eval::read_task(dir.path / "none.yaml"); }),
             Catch::Contains("expected the task file '" + (dir.path / "none.yaml").string()));
}

TEST_CASE("rolling windows predict every token once, as lm-eval cuts them", "[eval]") {
  const std::vector<int64_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  // max_length 4: the prefix conditions the first 4 tokens; each later window predicts up to 4 tokens after the
  // tokens that fill its input to 4 (lm-eval's get_rolling_token_windows + make_disjoint_window, context_len 1).
  const auto windows = eval::rolling_windows(tokens, /*prefix=*/99, /*max_length=*/4);
  REQUIRE(windows.size() == 3);
  CHECK(windows[0].context == std::vector<int64_t>{99});
  CHECK(windows[0].continuation == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(windows[1].context == std::vector<int64_t>{4});
  CHECK(windows[1].continuation == std::vector<int64_t>{5, 6, 7, 8});
  CHECK(windows[2].context == std::vector<int64_t>{6, 7, 8});
  CHECK(windows[2].continuation == std::vector<int64_t>{9, 10});
  // Short texts are one window; no text, none.
  CHECK(eval::rolling_windows(std::vector<int64_t>{5, 6}, 99, 4).size() == 1);
  CHECK(eval::rolling_windows(std::vector<int64_t>{}, 99, 4).empty());
}

TEST_CASE("lm-eval's counts: words by whitespace runs, characters as code points", "[eval]") {
  CHECK(eval::count_words("a b") == 2);
  CHECK(eval::count_words("  a b\n") == 4);  // re.split(r"\s+") keeps the empty pieces at both ends
  CHECK(eval::count_words("a\u00a0b\u3000c") == 3);
  CHECK(eval::count_chars("caf\u00e9") == 4);
  CHECK(std::string("caf\u00e9").size() == 5);
}

TEST_CASE("acc_norm divides by characters, acc_bytes by UTF-8 bytes", "[eval]") {
  // "ab" (2 characters, 2 bytes) and "ééé" (3 characters, 6 bytes): raw and per-character scores pick the first,
  // per-byte scores the second.
  const eval::Doc doc{.choices = {"ab", "\u00e9\u00e9\u00e9"}, .gold = 0};
  const std::vector<eval::Score> responses = {{.loglikelihood = -2.0}, {.loglikelihood = -4.0}};
  CHECK(eval::predicted_choice(doc, responses, "acc") == 0);
  CHECK(eval::predicted_choice(doc, responses, "acc_norm") == 0);   // -1.0 > -1.33
  CHECK(eval::predicted_choice(doc, responses, "acc_bytes") == 1);  // -0.67 > -1.0
  const eval::Task task{.metrics = {"acc", "acc_norm", "acc_bytes"}, .docs = {doc}};
  const eval::Metrics m = eval::doc_metrics(task, doc, responses);
  CHECK(m == eval::Metrics{{"acc", 1.0}, {"acc_norm", 1.0}, {"acc_bytes", 0.0}});
}

TEST_CASE("scoring reads the continuation's log-probabilities whatever the batch, padding and truncation", "[eval]") {
  // A model that puts logit 5 on token (t + 1) % 8 after t and 0 elsewhere: a continuation of successors has
  // log-probability n * (5 - log(e^5 + 7)) and is greedy.
  constexpr int64_t kVocab = 8;
  const eval::LogitsFn successor = [](const at::Tensor& tokens) {
    return at::one_hot((tokens + 1) % kVocab, kVocab).to(at::kFloat) * 5.0;  // (B, S, V)
  };
  const double step = 5.0 - std::log(std::exp(5.0) + 7.0);
  const std::vector<eval::TokenRequest> requests = {{{1, 2}, {3, 4}},           // successors: greedy
                                                    {{1, 2}, {3, 5}},           // the last is not
                                                    {{6, 7, 0, 1, 2, 3}, {4}},  // longer than max_length 4: cut
                                                    {{7}, {0, 1, 2}}};
  for (const int64_t batch : {1, 2, 4}) {
    INFO("batch size " << batch);
    const auto scores = eval::score(requests, successor, {.max_length = 4, .batch_size = batch});
    REQUIRE(scores.size() == 4);
    CHECK(std::abs(scores[0].loglikelihood - 2 * step) < 1e-12);
    CHECK(scores[0].greedy);
    CHECK(std::abs(scores[1].loglikelihood - (step + (0.0 - std::log(std::exp(5.0) + 7.0)))) < 1e-12);
    CHECK(!scores[1].greedy);
    CHECK(std::abs(scores[2].loglikelihood - step) < 1e-12);
    CHECK(std::abs(scores[3].loglikelihood - 3 * step) < 1e-12);
    CHECK(scores[3].tokens == 3);
  }
  CHECK_THAT(test::error_of([&] {
               eval::score({{{1}, {1, 2, 3, 4, 5}}}, successor, {.max_length = 4});
             }),
             Catch::Contains("expected continuations of at most --max-length 4 tokens, got one of 5"));
}
