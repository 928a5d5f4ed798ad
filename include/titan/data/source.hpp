// SPDX-License-Identifier: BSD-3-Clause
// Streaming document sources: files (plain, .gz, .zst; one file, a folder, or a glob of shards) read
// forward record by record, with a cursor (file, byte offset, line) that restores the exact position.
// Unlike Corpus (indexed, memory-mapped) a Source never scans ahead, so it serves terabyte datasets
// such as C4. Decoding (JSON, chat rendering, UTF-8 checks) is separate and thread-safe, so worker
// threads do it together with tokenization. The loader (dataloader.hpp) mixes and packs sources.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "titan/data/corpus.hpp"

namespace titan::data {

/// Where a source stands: the record next() returns next.
struct SourceCursor {
  int64_t epoch = 0;   ///< completed passes over the source
  int64_t file = 0;    ///< index into the sorted file list (document index for an in-memory corpus)
  int64_t offset = 0;  ///< uncompressed byte offset in that file
  int64_t line = 1;    ///< 1-based line at `offset`, for error messages
  bool operator==(const SourceCursor&) const = default;
};

/// One document as read: its raw bytes (a JSON line, a block of text) and where it starts.
struct Record {
  std::string bytes{};  ///< undecoded
  int64_t file = 0;     ///< index into the source's files
  int64_t line = 0;     ///< 1-based line where the record starts
};

/// A piece of a decoded document and whether its tokens are trained on (chat prompts are not).
struct Segment {
  std::string text{};     ///< UTF-8
  bool trainable = true;  ///< false: the tokens get label -100
};

class Source {
 public:
  virtual ~Source() = default;
  virtual const std::string& name() const = 0;
  /// The next record of this pass; false once the pass is over (seek to {epoch + 1} to go on).
  virtual bool next(Record& out) = 0;
  virtual SourceCursor cursor() const = 0;
  /// Continues at `cursor` (a value cursor() returned, possibly in another process).
  virtual void seek(const SourceCursor& cursor) = 0;
  /// The document of `record`, or nullopt for a bad record under OnBadRecord::skip (logged and
  /// counted). Under OnBadRecord::error a bad record throws c10::ValueError naming file and line.
  /// Thread-safe: workers call it concurrently.
  virtual std::optional<std::vector<Segment>> decode(const Record& record) const = 0;
  /// Bad records and files skipped so far (OnBadRecord::skip).
  virtual int64_t skipped() const = 0;
};

/// A source over the files of `spec` (see CorpusSpec::path). Throws c10::ValueError naming the
/// dataset and path when nothing matches.
std::shared_ptr<Source> open_source(std::string name, const CorpusSpec& spec);

/// A source over an indexed corpus (tests, in-memory documents): the cursor's `file` is the document index.
std::shared_ptr<Source> corpus_source(std::shared_ptr<const Corpus> corpus);

/// Registered dataset `name` as a source (dataset_spec, then open_source).
std::shared_ptr<Source> load_source(const std::string& name, const std::filesystem::path& dataset_path = {});

/// The decoded text of the first documents of `source`, up to `max_bytes`, as an in-memory corpus
/// (what a tokenizer is trained on). Leaves the source at its start.
std::shared_ptr<Corpus> sample_corpus(Source& source, int64_t max_bytes);

}  // namespace titan::data
