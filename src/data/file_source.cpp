// SPDX-License-Identifier: BSD-3-Clause
// FileSource: records read forward from a list of (possibly compressed) files; decoding and the
// bad-record policy. Also the Corpus adapter and sample_corpus (see source.hpp).
#include <nlohmann/json.hpp>

#include <atomic>
#include <bit>

#include "line_reader.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/data/source.hpp"

namespace titan::data {
namespace {

namespace fs = std::filesystem;

bool is_blank_line(std::string_view line) { return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos; }

// Reports a bad record: throws under OnBadRecord::error, else logs (the first few, then at powers of
// two, so a corrupt shard cannot flood the log) and counts.
class BadRecords {
 public:
  BadRecords(std::string dataset, OnBadRecord policy) : dataset_(std::move(dataset)), policy_(policy) {}

  template <class... T>
  void report(const fs::path& file, int64_t line, fmt::format_string<T...> what, T&&... args) const {
    const std::string message = fmt::format(what, std::forward<T>(args)...);
    TITAN_CHECK_VALUE(policy_ == OnBadRecord::skip,
                      "[titan::data::Source] dataset \"{}\", {}:{}: {} Fix the data, "
                      "or skip bad records with on_bad_record = skip (training.dataset_on_bad_record).",
                      dataset_, file.string(), line, message);
    const int64_t n = ++count_;
    if (n <= 10 || std::has_single_bit(uint64_t(n))) {
      log::warn("dataset {}: skipped bad record {} at {}:{}: {}", dataset_, n, file.string(), line, message);
    }
  }
  int64_t count() const { return count_; }

 private:
  std::string dataset_;
  OnBadRecord policy_;
  mutable std::atomic<int64_t> count_{0};
};

// nullopt when `text` is valid UTF-8, else a description of the first bad byte.
std::optional<std::string> utf8_problem(std::string_view text) {
  size_t at = 0;
  if (detail::is_valid_utf8(text, &at)) return std::nullopt;
  return fmt::format("expected UTF-8 text, got the invalid byte 0x{:02x} at byte {} of the record.",
                     static_cast<unsigned char>(text[at]), at);
}

class FileSource final : public Source {
 public:
  FileSource(std::string name, CorpusSpec spec, std::vector<fs::path> files)
      : name_(std::move(name)), spec_(std::move(spec)), files_(std::move(files)), bad_(name_, spec_.on_bad_record) {}

  const std::string& name() const override { return name_; }
  SourceCursor cursor() const override { return cursor_; }
  int64_t skipped() const override { return bad_.count(); }

  void seek(const SourceCursor& cursor) override {
    TITAN_CHECK_VALUE(cursor.file >= 0 && cursor.file <= int64_t(files_.size()) && cursor.offset >= 0,
                      "[titan::data::Source] dataset \"{}\": expected a saved file index in [0, {}], got {}. The "
                      "dataset's files changed since the state was saved.",
                      name_, files_.size(), cursor.file);
    reader_.reset();
    cursor_ = cursor;
    records_in_file_ = cursor.offset > 0 ? 1 : 0;  // a file resumed mid-way is not empty
    if (cursor.offset > 0) {
      open_current();
      if (reader_) reader_->seek(cursor.offset, cursor.line);
    }
  }

  bool next(Record& out) override {
    while (cursor_.file < int64_t(files_.size())) {
      if (!reader_) open_current();
      if (reader_ && read_record(out)) {
        out.file = cursor_.file;
        cursor_.offset = reader_->offset();
        cursor_.line = reader_->line();
        ++records_in_file_;
        return true;
      }
      if (reader_ && records_in_file_ == 0) {
        bad_.report(files_[size_t(cursor_.file)], 1, "expected at least one document in the shard, got an empty one.");
      }
      reader_.reset();
      cursor_ = {.epoch = cursor_.epoch, .file = cursor_.file + 1, .offset = 0, .line = 1};
      records_in_file_ = 0;
    }
    return false;
  }

  std::optional<std::vector<Segment>> decode(const Record& record) const override {
    const fs::path& file = files_[size_t(record.file)];
    if (auto problem = utf8_problem(record.bytes)) {
      bad_.report(file, record.line, "{}", *problem);
      return std::nullopt;
    }
    if (spec_.format == DatasetFormat::text || spec_.format == DatasetFormat::fortunes) {
      return std::vector<Segment>{{.text = record.bytes, .trainable = true}};
    }
    nlohmann::json obj;
    try {
      obj = nlohmann::json::parse(record.bytes);
    } catch (const nlohmann::json::parse_error& e) {
      bad_.report(file, record.line, "expected one JSON object per line, got a syntax error at byte {}.", e.byte);
      return std::nullopt;
    }
    if (!obj.is_object()) {
      bad_.report(file, record.line, "expected a JSON object, got a {}.", obj.type_name());
      return std::nullopt;
    }
    return spec_.format == DatasetFormat::chat ? decode_chat(obj, file, record.line)
                                               : decode_text(obj, file, record.line);
  }

 private:
  std::optional<std::vector<Segment>> decode_text(const nlohmann::json& obj, const fs::path& file, int64_t line) const {
    const auto it = obj.find(spec_.text_field);
    if (it == obj.end() || !it->is_string()) {
      bad_.report(file, line,
                  "expected a string field \"{}\", got {}. Set the dataset's text_field to the key "
                  "holding the text.",
                  spec_.text_field, it == obj.end() ? "no such key" : it->type_name());
      return std::nullopt;
    }
    return std::vector<Segment>{{.text = it->get<std::string>(), .trainable = true}};
  }

  std::optional<std::vector<Segment>> decode_chat(const nlohmann::json& obj, const fs::path& file, int64_t line) const {
    const auto it = obj.find(spec_.messages_field);
    if (it == obj.end() || !it->is_array() || it->empty()) {
      bad_.report(file, line, "expected a non-empty array \"{}\" of {{\"role\", \"content\"}} messages, got {}.",
                  spec_.messages_field, it == obj.end() ? "no such key" : it->dump().substr(0, 80));
      return std::nullopt;
    }
    std::vector<Segment> segments;
    for (const auto& message : *it) {
      const bool ok = message.is_object() && message.contains("role") && message["role"].is_string() &&
                      message.contains("content") && message["content"].is_string();
      if (!ok) {
        bad_.report(file, line, "expected messages with string \"role\" and \"content\", got {}.",
                    message.dump().substr(0, 80));
        return std::nullopt;
      }
      const std::string role = message["role"].get<std::string>();
      std::string start = spec_.chat_template.turn_start;
      if (const size_t at = start.find("{role}"); at != std::string::npos) start.replace(at, 6, role);
      const bool trained = role == "assistant";
      segments.push_back({.text = std::move(start), .trainable = false});
      segments.push_back(
          {.text = message["content"].get<std::string>() + spec_.chat_template.turn_end, .trainable = trained});
    }
    return segments;
  }

  void open_current() {
    const fs::path& file = files_[size_t(cursor_.file)];
    try {
      reader_ = std::make_unique<detail::LineReader>(file);
    } catch (const c10::ValueError& e) {
      bad_.report(file, 0, "expected a readable file, got: {}", e.what_without_backtrace());
    }
  }

  // The next document's lines (format dependent) joined with '\n'; false at the end of the file.
  bool read_record(Record& out) {
    std::string_view line;
    out.bytes.clear();
    switch (spec_.format) {
      case DatasetFormat::jsonl:
      case DatasetFormat::chat:
        while (true) {
          const int64_t number = reader_->line();
          if (!reader_->next(line)) return false;
          if (is_blank_line(line)) continue;
          out.bytes.assign(line);
          out.line = number;
          return true;
        }
      case DatasetFormat::text:
        if (!spec_.split_blank_lines)
          return read_block(
              out, [](std::string_view) { return false; }, false);
        return read_block(out, is_blank_line, true);
      case DatasetFormat::fortunes:
        return read_block(
            out, [](std::string_view l) { return l == "%"; }, true);
    }
    return false;
  }

  // Lines up to a separator line (or the end of the file), skipping leading separators.
  template <class IsSeparator>
  bool read_block(Record& out, IsSeparator&& is_separator, bool skip_blank_start) {
    std::string_view line;
    bool open = false;
    while (true) {
      const int64_t number = reader_->line();
      if (!reader_->next(line)) return open;
      if (is_separator(line) || (!open && skip_blank_start && is_blank_line(line))) {
        if (open) return true;
        continue;
      }
      if (!open) out.line = number;
      if (open) out.bytes += '\n';
      out.bytes += line;
      open = true;
    }
  }

  std::string name_;
  CorpusSpec spec_;
  std::vector<fs::path> files_;
  BadRecords bad_;
  SourceCursor cursor_{};
  std::unique_ptr<detail::LineReader> reader_;
  int64_t records_in_file_ = 0;
};

class CorpusSource final : public Source {
 public:
  explicit CorpusSource(std::shared_ptr<const Corpus> corpus)
      : corpus_(std::move(corpus)), bad_(corpus_->name(), OnBadRecord::error) {}

  const std::string& name() const override { return corpus_->name(); }
  SourceCursor cursor() const override { return cursor_; }
  int64_t skipped() const override { return 0; }
  void seek(const SourceCursor& cursor) override {
    TITAN_CHECK_VALUE(cursor.file >= 0 && cursor.file <= corpus_->size(),
                      "[titan::data::Source] dataset \"{}\": "
                      "expected a saved document index in [0, {}], got {}. The dataset changed since the state was "
                      "saved.",
                      corpus_->name(), corpus_->size(), cursor.file);
    cursor_ = cursor;
  }
  bool next(Record& out) override {
    if (cursor_.file >= corpus_->size()) return false;
    out = {.bytes = corpus_->document(cursor_.file), .file = cursor_.file, .line = 0};
    ++cursor_.file;
    return true;
  }
  std::optional<std::vector<Segment>> decode(const Record& record) const override {
    if (auto problem = utf8_problem(record.bytes)) {
      bad_.report(fmt::format("document {}", record.file), 0, "{}", *problem);
    }
    return std::vector<Segment>{{.text = record.bytes, .trainable = true}};
  }

 private:
  std::shared_ptr<const Corpus> corpus_;
  BadRecords bad_;
  SourceCursor cursor_{};
};

}  // namespace

std::shared_ptr<Source> open_source(std::string name, const CorpusSpec& spec) {
  std::vector<fs::path> files = list_corpus_files(spec);
  // A broken link is listed (and reported as unreadable when read), a missing path is not.
  TITAN_CHECK_VALUE(!files.empty() && fs::exists(fs::symlink_status(files[0])),
                    "[titan::data::open_source] dataset \"{}\": expected files at {}, got none. Set "
                    "training.dataset_path to a file, a folder or a glob of shards.",
                    name, spec.path.string());
  return std::make_shared<FileSource>(std::move(name), spec, std::move(files));
}

std::shared_ptr<Source> corpus_source(std::shared_ptr<const Corpus> corpus) {
  TITAN_CHECK_VALUE(corpus != nullptr, "[titan::data::corpus_source] expected a corpus, got null.");
  return std::make_shared<CorpusSource>(std::move(corpus));
}

std::shared_ptr<Source> load_source(const std::string& name, const fs::path& dataset_path) {
  return open_source(name, dataset_spec(name, dataset_path));
}

std::shared_ptr<Corpus> sample_corpus(Source& source, int64_t max_bytes) {
  source.seek({});
  std::vector<std::string> documents;
  int64_t bytes = 0;
  Record record;
  while (bytes < max_bytes && source.next(record)) {
    const auto segments = source.decode(record);
    if (!segments) continue;
    std::string text;
    for (const Segment& s : *segments) text += s.text;
    bytes += int64_t(text.size());
    documents.push_back(std::move(text));
  }
  source.seek({});
  return make_corpus(source.name(), std::move(documents));
}

}  // namespace titan::data
