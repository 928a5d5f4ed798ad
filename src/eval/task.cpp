// SPDX-License-Identifier: BSD-3-Clause
// lm-eval task YAMLs read into documents, as lm-eval's ConfigurableTask builds them at zero shot: the context is
// description + doc_to_text, a multiple-choice document's continuations are target_delimiter + each choice, and a
// doc_to_* value that is a field name reads that field, otherwise it is a template.
#include "titan/eval/task.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <sstream>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "template.hpp"
#include "titan/core/error.hpp"
#include "yaml_subset.hpp"

namespace titan::eval {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

// The keys read, and those lm-eval uses for what titan-eval does not run (few-shot, filters, generation, code).
constexpr std::array<std::string_view, 22> kKeys = {"task",
                                                    "tag",
                                                    "dataset_path",
                                                    "dataset_name",
                                                    "dataset_kwargs",
                                                    "test_split",
                                                    "validation_split",
                                                    "training_split",
                                                    "fewshot_split",
                                                    "output_type",
                                                    "doc_to_text",
                                                    "doc_to_target",
                                                    "doc_to_choice",
                                                    "description",
                                                    "target_delimiter",
                                                    "fewshot_delimiter",
                                                    "num_fewshot",
                                                    "metric_list",
                                                    "metadata",
                                                    "should_decontaminate",
                                                    "doc_to_decontamination_query",
                                                    "repeats"};

std::string read_text(const fs::path& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  TITAN_CHECK_VALUE(in.good(), "[titan::eval] expected {} '{}' to be a readable file, got none. Check the path.", what,
                    path.string());
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string where(const Task& task, std::string_view key) { return fmt::format("{}: {}", task.source.string(), key); }

// The aggregation lm-eval gives each metric by default: a metric_list entry may repeat it, not change it.
std::string default_aggregation(const std::string& metric) {
  if (metric == "perplexity") return "perplexity";
  if (metric == "word_perplexity" || metric == "byte_perplexity" || metric == "token_perplexity")
    return "weighted_perplexity";
  if (metric == "bits_per_byte") return "bits_per_byte";
  return "mean";
}

std::vector<std::string> read_metrics(const Json& config, const Task& task) {
  if (!config.contains("metric_list")) return default_metrics(task.output_type);
  const Json& list = config.at("metric_list");
  TITAN_CHECK_VALUE(list.is_array() && !list.empty(),
                    "[titan::eval] {}: expected a list of '- metric: NAME' entries, got {}.",
                    where(task, "metric_list"), list.dump());
  const std::vector<std::string> known = known_metrics(task.output_type);
  std::vector<std::string> metrics;
  for (const Json& entry : list) {
    TITAN_CHECK_VALUE(entry.is_object() && entry.contains("metric") && entry.at("metric").is_string(),
                      "[titan::eval] {}: expected entries '- metric: NAME', got {}.", where(task, "metric_list"),
                      entry.dump());
    const std::string metric = entry.at("metric").get<std::string>();
    TITAN_CHECK_VALUE(std::find(known.begin(), known.end(), metric) != known.end(),
                      "[titan::eval] {}: expected a metric of {} tasks ({}), got '{}'. Remove it or use one of those.",
                      where(task, "metric_list"), output_type_name(task.output_type), fmt::join(known, ", "), metric);
    for (const auto& [key, value] : entry.items()) {
      TITAN_CHECK_VALUE(key == "metric" || key == "aggregation" || key == "higher_is_better",
                        "[titan::eval] {}: expected metric, aggregation or higher_is_better in an entry, got '{}'.",
                        where(task, "metric_list"), key);
    }
    if (entry.contains("aggregation")) {
      TITAN_CHECK_VALUE(entry.at("aggregation") == default_aggregation(metric),
                        "[titan::eval] {}: expected {}'s aggregation {} (lm-eval's), got {}. Remove the aggregation.",
                        where(task, "metric_list"), metric, default_aggregation(metric),
                        entry.at("aggregation").dump());
    }
    metrics.push_back(metric);
  }
  return metrics;
}

// The files of the evaluated split (test_split, else validation_split), relative ones from the YAML's folder.
std::vector<fs::path> split_files(const Json& config, const Task& task) {
  const Json path = config.value("dataset_path", Json());
  TITAN_CHECK_VALUE(path == "json",
                    "[titan::eval] {}: expected json (local JSON or JSON-lines files named by "
                    "dataset_kwargs.data_files), got {}. titan-eval reads no dataset hub: export the split to a .jsonl "
                    "file.",
                    where(task, "dataset_path"), path.dump());
  TITAN_CHECK_VALUE(config.value("dataset_name", Json()).is_null(),
                    "[titan::eval] {}: expected no dataset_name for json data, got {}.", where(task, "dataset_name"),
                    config.at("dataset_name").dump());
  const Json kwargs = config.value("dataset_kwargs", Json::object());
  TITAN_CHECK_VALUE(kwargs.is_object() && kwargs.contains("data_files"),
                    "[titan::eval] {}: expected data_files (a file, or split: file), got {}.",
                    where(task, "dataset_kwargs"), kwargs.dump());
  for (const auto& [key, _] : kwargs.items()) {
    TITAN_CHECK_VALUE(key == "data_files", "[titan::eval] {}: expected only data_files, got '{}'.",
                      where(task, "dataset_kwargs"), key);
  }
  const Json split_key =
      config.contains("test_split") ? config.at("test_split") : config.value("validation_split", Json());
  TITAN_CHECK_VALUE(split_key.is_string(),
                    "[titan::eval] {}: expected test_split or validation_split to name the split evaluated, got none.",
                    where(task, "test_split"));
  const std::string split = split_key.get<std::string>();
  Json files = kwargs.at("data_files");
  // A file or list of files without splits is the "train" split, as the datasets library names it.
  if (!files.is_object()) files = Json{{"train", files}};
  TITAN_CHECK_VALUE(files.contains(split),
                    "[titan::eval] {}: expected data_files for split '{}', got {}. Name the split's file under "
                    "dataset_kwargs.data_files.",
                    where(task, "dataset_kwargs.data_files"), split, files.dump());
  Json named = files.at(split);
  if (!named.is_array()) named = Json::array({named});
  std::vector<fs::path> out;
  for (const Json& file : named) {
    TITAN_CHECK_VALUE(file.is_string(), "[titan::eval] {}: expected file paths, got {}.",
                      where(task, "dataset_kwargs.data_files"), file.dump());
    const fs::path p = file.get<std::string>();
    out.push_back(p.is_absolute() ? p : task.source.parent_path() / p);
  }
  return out;
}

// The rows of a JSON-lines file or of a JSON file holding a list of objects.
std::vector<Json> read_rows(const fs::path& file) {
  const std::string text = read_text(file, "the data file");
  std::vector<Json> rows;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    try {
      for (Json& row : Json::parse(text)) rows.push_back(std::move(row));
    } catch (const nlohmann::json::exception& e) {
      TITAN_CHECK_VALUE(false, "[titan::eval] {}: expected a JSON list of objects, got: {}", file.string(), e.what());
    }
  } else {
    std::istringstream in(text);
    int number = 0;
    for (std::string line; std::getline(in, line);) {
      ++number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        rows.push_back(Json::parse(line));
      } catch (const nlohmann::json::exception& e) {
        TITAN_CHECK_VALUE(false, "[titan::eval] {}:{}: expected one JSON object per line, got: {}", file.string(),
                          number, e.what());
      }
    }
  }
  for (const Json& row : rows) {
    TITAN_CHECK_VALUE(row.is_object(), "[titan::eval] {}: expected every row to be an object, got {}.", file.string(),
                      row.dump());
  }
  return rows;
}

// A doc_to_* value for one document: a field when the setting names one, else the rendered template; a YAML
// number stands for itself.
Json field_or_template(const Json& setting, const Json& doc, const Task& task, const std::string& key) {
  if (!setting.is_string()) return setting;
  const std::string s = setting.get<std::string>();
  if (doc.contains(s)) return doc.at(s);
  return detail::render_template(s, doc, {task.source.string(), key});
}

// lm-eval turns a rendered target or text that is all digits into an int when the task has choices.
bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string> choices_of(const Json& setting, const Json& doc, const Task& task) {
  Json value = setting;
  if (setting.is_string()) {
    const std::string s = setting.get<std::string>();
    const detail::TemplateSite site{task.source.string(), "doc_to_choice"};
    if (doc.contains(s)) {
      value = doc.at(s);
    } else if (auto field = detail::single_field(s, doc, site)) {
      value = *field;
    } else {
      TITAN_CHECK_VALUE(false,
                        "[titan::eval] {}: expected a field name, a YAML list or one {{{{ field }}}} naming a list, "
                        "got '{}'. Put the choices in a list field of the data file.",
                        where(task, "doc_to_choice"), s);
    }
  } else if (setting.is_object()) {
    value = Json::array();
    for (const auto& [_, v] : setting.items()) value.push_back(v);
  }
  TITAN_CHECK_VALUE(value.is_array() && !value.empty(),
                    "[titan::eval] {}: expected a non-empty list of choices, got {}.", where(task, "doc_to_choice"),
                    value.dump());
  std::vector<std::string> out;
  for (const Json& c : value) {
    TITAN_CHECK_VALUE(c.is_string(), "[titan::eval] {}: expected every choice to be text, got {}.",
                      where(task, "doc_to_choice"), c.dump());
    out.push_back(c.get<std::string>());
  }
  return out;
}

int64_t gold_of(const Json& target, const std::vector<std::string>& choices, const Task& task) {
  Json t = target;
  if (t.is_string() && all_digits(t.get<std::string>())) t = std::stoll(t.get<std::string>());
  TITAN_CHECK_VALUE(t.is_number_integer() || t.is_string(),
                    "[titan::eval] {}: expected the answer's index or text, got {}. A list of answers (several right "
                    "choices) is not supported.",
                    where(task, "doc_to_target"), t.dump());
  if (t.is_number_integer()) {
    const int64_t i = t.get<int64_t>();
    return i >= 0 && i < static_cast<int64_t>(choices.size()) ? i : -1;
  }
  const auto it = std::find(choices.begin(), choices.end(), t.get<std::string>());
  return it == choices.end() ? -1 : it - choices.begin();
}

std::string text_of(const Json& value, const Task& task, const std::string& key) {
  TITAN_CHECK_VALUE(value.is_string(),
                    "[titan::eval] {}: expected text, got {}. An index here means several contexts (Winogrande's "
                    "multiple inputs), which titan-eval does not run.",
                    where(task, key), value.dump());
  return value.get<std::string>();
}

Doc doc_of(const Json& config, const Json& row, const Task& task) {
  Doc doc;
  const Json description = config.value("description", Json(""));
  doc.context = text_of(field_or_template(description, row, task, "description"), task, "description");
  const Json text = field_or_template(config.value("doc_to_text", Json("")), row, task, "doc_to_text");
  const bool has_choices = config.contains("doc_to_choice");
  TITAN_CHECK_VALUE(!(text.is_string() && has_choices && all_digits(text.get<std::string>())),
                    "[titan::eval] {}: expected text, got the index {}: several contexts (Winogrande's multiple "
                    "inputs) are not supported.",
                    where(task, "doc_to_text"), text.dump());
  doc.context += text_of(text, task, "doc_to_text");
  const Json target = field_or_template(config.value("doc_to_target", Json()), row, task, "doc_to_target");
  if (task.output_type == OutputType::multiple_choice) {
    doc.choices = choices_of(config.at("doc_to_choice"), row, task);
    doc.gold = gold_of(target, doc.choices, task);
  } else {
    doc.target = text_of(target, task, "doc_to_target");
  }
  return doc;
}

}  // namespace

std::string_view output_type_name(OutputType type) {
  switch (type) {
    case OutputType::multiple_choice:
      return "multiple_choice";
    case OutputType::loglikelihood:
      return "loglikelihood";
    case OutputType::loglikelihood_rolling:
      return "loglikelihood_rolling";
  }
  return "?";
}

std::vector<std::string> default_metrics(OutputType type) {
  switch (type) {
    case OutputType::multiple_choice:
      return {"acc", "acc_norm"};
    case OutputType::loglikelihood:
      return {"perplexity", "acc"};
    case OutputType::loglikelihood_rolling:
      return {"word_perplexity", "byte_perplexity", "bits_per_byte"};
  }
  return {};
}

std::vector<std::string> known_metrics(OutputType type) {
  switch (type) {
    case OutputType::multiple_choice:
      return {"acc", "acc_norm", "acc_bytes"};
    case OutputType::loglikelihood:
      return {"perplexity", "acc"};
    case OutputType::loglikelihood_rolling:
      return {"word_perplexity", "byte_perplexity", "bits_per_byte", "token_perplexity"};
  }
  return {};
}

Task read_task(const fs::path& yaml) {
  Task task;
  task.source = yaml;
  const Json config = detail::parse_yaml_subset(read_text(yaml, "the task file"), yaml.string());
  TITAN_CHECK_VALUE(config.is_object(), "[titan::eval] {}: expected a mapping of task keys, got {}.", yaml.string(),
                    config.dump());
  for (const auto& [key, _] : config.items()) {
    TITAN_CHECK_VALUE(std::find(kKeys.begin(), kKeys.end(), key) != kKeys.end(),
                      "[titan::eval] {}: expected a key titan-eval runs ({}), got '{}'. titan-eval runs zero-shot "
                      "loglikelihood, loglikelihood_rolling and multiple_choice tasks over local data "
                      "(docs/evaluation.md); remove the key or precompute what it does in the data file.",
                      yaml.string(), fmt::join(kKeys, ", "), key);
  }
  TITAN_CHECK_VALUE(config.contains("task") && config.at("task").is_string(),
                    "[titan::eval] {}: expected the task's name, got {}.", where(task, "task"),
                    config.value("task", Json()).dump());
  task.name = config.at("task").get<std::string>();
  const Json type = config.value("output_type", Json("generate_until"));
  bool known_type = false;
  for (const OutputType t :
       {OutputType::multiple_choice, OutputType::loglikelihood, OutputType::loglikelihood_rolling}) {
    if (type == output_type_name(t)) {
      task.output_type = t;
      known_type = true;
    }
  }
  TITAN_CHECK_VALUE(known_type,
                    "[titan::eval] {}: expected multiple_choice, loglikelihood or loglikelihood_rolling, got {} "
                    "(lm-eval's default is generate_until, which titan-eval does not run).",
                    where(task, "output_type"), type.dump());
  TITAN_CHECK_VALUE(config.value("num_fewshot", Json(0)) == 0 || config.at("num_fewshot").is_null(),
                    "[titan::eval] {}: expected 0 (titan-eval evaluates zero-shot), got {}.",
                    where(task, "num_fewshot"), config.at("num_fewshot").dump());
  TITAN_CHECK_VALUE(config.value("repeats", Json(1)) == 1, "[titan::eval] {}: expected 1, got {}.",
                    where(task, "repeats"), config.at("repeats").dump());
  TITAN_CHECK_VALUE(task.output_type != OutputType::multiple_choice || config.contains("doc_to_choice"),
                    "[titan::eval] {}: expected doc_to_choice in a multiple_choice task, got none.",
                    where(task, "doc_to_choice"));
  TITAN_CHECK_VALUE(config.contains("doc_to_target"), "[titan::eval] {}: expected doc_to_target, got none.",
                    where(task, "doc_to_target"));
  if (config.contains("target_delimiter")) {
    task.target_delimiter = text_of(config.at("target_delimiter"), task, "target_delimiter");
  }
  task.metrics = read_metrics(config, task);
  for (const fs::path& file : split_files(config, task)) {
    for (const Json& row : read_rows(file)) task.docs.push_back(doc_of(config, row, task));
  }
  TITAN_CHECK_VALUE(!task.docs.empty(), "[titan::eval] {}: expected documents in the evaluated split, got none.",
                    where(task, "dataset_kwargs.data_files"));
  return task;
}

std::vector<Task> read_tasks(const fs::path& file_or_folder, int64_t limit) {
  std::vector<fs::path> files = {file_or_folder};
  if (fs::is_directory(file_or_folder)) {
    files.clear();
    for (const auto& entry : fs::directory_iterator(file_or_folder)) {
      if (entry.path().extension() == ".yaml" || entry.path().extension() == ".yml") files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    TITAN_CHECK_VALUE(!files.empty(), "[titan::eval] expected task YAMLs in the folder '{}', got none.",
                      file_or_folder.string());
  }
  std::vector<Task> tasks;
  for (const fs::path& file : files) {
    tasks.push_back(read_task(file));
    if (limit > 0 && static_cast<int64_t>(tasks.back().docs.size()) > limit)
      tasks.back().docs.resize(static_cast<size_t>(limit));
  }
  return tasks;
}

Task text_task(const fs::path& file, bool paragraphs) {
  Task task{.name = file.stem().string(),
            .output_type = OutputType::loglikelihood_rolling,
            .metrics = {"token_perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte"},
            .source = file};
  const std::string text = read_text(file, "the text file");
  if (!paragraphs) {
    task.docs.push_back({.target = text});
  } else {
    size_t begin = 0;
    while (begin < text.size()) {
      const size_t end = std::min(text.find("\n\n", begin), text.size());
      if (end > begin) task.docs.push_back({.target = text.substr(begin, end - begin)});
      begin = end + 2;
    }
  }
  TITAN_CHECK_VALUE(!task.docs.empty() && !task.docs.front().target.empty(),
                    "[titan::eval] expected text in '{}', got an empty file.", file.string());
  return task;
}

}  // namespace titan::eval
