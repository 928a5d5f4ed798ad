// SPDX-License-Identifier: BSD-3-Clause
// Where training text comes from: a Corpus is an ordered, re-readable list of documents (plain text,
// JSON Lines, or Debian's fortunes files), and the named-dataset registry (`fortunes`,
// `tinyshakespeare`, your own) maps training.dataset / training.dataset_path to one.
#pragma once

#include "titan/core/choices.hpp"  // DatasetFormat, OnBadRecord

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace titan::data {

/// Documents in a fixed order, readable by index, so a loader can resume at any document.
/// Implementations are immutable and safe to read from several threads.
class Corpus {
 public:
  virtual ~Corpus() = default;
  virtual const std::string& name() const = 0;
  virtual int64_t size() const = 0;
  /// Document `index` in [0, size()).
  virtual std::string document(int64_t index) const = 0;
  /// The files read and their sizes in bytes: what identifies the corpus (e.g. for caches).
  virtual std::vector<std::pair<std::filesystem::path, uintmax_t>> files() const = 0;
};

/// How a chat is rendered to text: turn_start, the content, turn_end, for each message in order.
/// Only assistant turns are trained on (their content and turn_end); everything else gets label -100.
struct ChatTemplate {
  std::string turn_start = "<|{role}|>\n";  ///< before each message; "{role}" becomes the message's role
  std::string turn_end = "<|end|>\n";       ///< after each message
};

struct CorpusSpec {
  DatasetFormat format = DatasetFormat::text;  ///< see titan::DatasetFormat (core/choices.hpp)
  /// A file, a glob of files ("shards/*.jsonl.gz"), or a folder read recursively in path order: text
  /// takes every file but hidden ones, jsonl and chat take *.jsonl and *.json (also .gz / .zst
  /// compressed), fortunes takes files without an extension outside `off/`.
  std::filesystem::path path;
  std::string text_field = "text";  ///< jsonl only
  /// text only: each run of non-blank lines is a document (true), or each file is one (false).
  bool split_blank_lines = true;
  std::string messages_field = "messages";         ///< chat only: the key holding the message list
  ChatTemplate chat_template = {};                 ///< chat only
  OnBadRecord on_bad_record = OnBadRecord::error;  ///< streaming sources only (source.hpp)
};

/// Indexes the files of `spec` (their contents are read on demand). Throws c10::ValueError naming
/// the corpus and path when the path is missing or holds no document.
std::shared_ptr<Corpus> open_corpus(std::string name, const CorpusSpec& spec);

/// A corpus over documents held in memory (tests, generated data).
std::shared_ptr<Corpus> make_corpus(std::string name, std::vector<std::string> documents);

/// Adds or replaces a named dataset. `missing_hint` is appended to the error when its path is
/// missing (say how to get the data).
void register_dataset(const std::string& name, CorpusSpec spec, std::string missing_hint = "");

/// The registered names, sorted. Built in: `fortunes` (Debian's fortunes, default path
/// /usr/share/games/fortunes) and `tinyshakespeare` (no default path: give dataset_path).
std::vector<std::string> registered_datasets();

/// The registered spec of dataset `name`, its path replaced by a non-empty `dataset_path`
/// (training.dataset_path). Errors name the dataset, the path and what to do.
CorpusSpec dataset_spec(const std::string& name, const std::filesystem::path& dataset_path = {});

/// The files of `spec`, sorted: the file itself, a glob's matches, or a folder's files of its format.
std::vector<std::filesystem::path> list_corpus_files(const CorpusSpec& spec);

/// Opens dataset `name` (dataset_spec) as an indexed corpus; compressed files need load_source.
std::shared_ptr<Corpus> load_dataset(const std::string& name, const std::filesystem::path& dataset_path = {});

}  // namespace titan::data
