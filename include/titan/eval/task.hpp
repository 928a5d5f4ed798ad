// SPDX-License-Identifier: BSD-3-Clause
// Evaluation tasks in lm-eval-harness's format: a task YAML (task, dataset_path: json, dataset_kwargs.data_files,
// output_type, doc_to_text / doc_to_target / doc_to_choice, description, target_delimiter, metric_list) over a
// local JSON or JSON-lines file, read into the documents lm-eval would build from it, zero-shot. The requests
// and their scores are in eval/requests.hpp and eval/scoring.hpp, the metrics in eval/metrics.hpp; the whole
// path in eval/evaluator.hpp. docs/evaluation.md lists what of the format is read.
//
//   const titan::eval::Task task = titan::eval::read_task("tasks/arc_easy_local.yaml");
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace titan::eval {

/// lm-eval's request kinds (output_type); generate_until is not one titan-eval runs.
enum class OutputType { multiple_choice, loglikelihood, loglikelihood_rolling };

/// The output_type spelling: "multiple_choice", "loglikelihood", "loglikelihood_rolling".
std::string_view output_type_name(OutputType type);

/// One document as the task asks about it.
struct Doc {
  /// description + doc_to_text: what the continuations are scored after (empty for loglikelihood_rolling).
  std::string context{};
  /// multiple_choice: the choices (doc_to_choice), each scored after context + target_delimiter.
  std::vector<std::string> choices{};
  /// multiple_choice: the index of the right choice; -1 when doc_to_target names none of them (scored wrong).
  int64_t gold = -1;
  /// loglikelihood: the continuation (doc_to_target); loglikelihood_rolling: the whole text scored.
  std::string target{};
};

/// A task read from its file.
struct Task {
  /// The task's name (`task:`).
  std::string name{};
  OutputType output_type = OutputType::multiple_choice;
  /// Put between the context and each choice (target_delimiter; lm-eval's default " ").
  std::string target_delimiter = " ";
  /// The metrics reported, in metric_list's order (or lm-eval's defaults for the output type).
  std::vector<std::string> metrics{};
  /// The evaluated split's documents, in file order.
  std::vector<Doc> docs{};
  /// The file the task came from, for messages.
  std::filesystem::path source{};
};

/// The metrics lm-eval reports for `type` when metric_list is absent.
std::vector<std::string> default_metrics(OutputType type);

/// The metrics titan-eval computes for `type` (a metric_list entry outside them is an error naming it).
std::vector<std::string> known_metrics(OutputType type);

/// The task of an lm-eval task YAML and its local data (relative data_files are read from the YAML's folder).
/// Errors name the file and the key: a missing file, a key titan-eval does not run (process_docs, filters,
/// few-shot, !function, generate_until, ...), an unknown metric, a field a template names that a document lacks.
Task read_task(const std::filesystem::path& yaml);

/// The tasks of a task YAML, or of every *.yaml of a folder (in name order), each cut to its first `limit`
/// documents when limit > 0. A folder without YAMLs is an error naming it.
std::vector<Task> read_tasks(const std::filesystem::path& file_or_folder, int64_t limit = -1);

/// A perplexity task over a plain text file (titan-eval --text FILE): one loglikelihood_rolling document per
/// file, or one per paragraph (blank-line separated) with `paragraphs`; its metrics are lm-eval's
/// word_perplexity, byte_perplexity and bits_per_byte, plus titan's token_perplexity.
Task text_task(const std::filesystem::path& file, bool paragraphs = false);

}  // namespace titan::eval
