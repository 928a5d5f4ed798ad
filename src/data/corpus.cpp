// SPDX-License-Identifier: BSD-3-Clause
// File-backed corpora: files are memory-mapped and indexed once (document = byte span), so opening
// a multi-GB JSONL costs one scan and reading document i is a copy out of the page cache.
#include "titan/data/corpus.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <string_view>

#include "titan/core/error.hpp"

namespace titan::data {
namespace {

namespace fs = std::filesystem;

class MappedFile {
 public:
  explicit MappedFile(const fs::path& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    TITAN_CHECK_VALUE(fd >= 0, "[titan::data::Corpus] expected a readable file at {}, got errno {}.", path.string(),
                      errno);
    struct stat st {};
    ::fstat(fd, &st);
    size_ = size_t(st.st_size);
    if (size_ > 0) {
      data_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      ::close(fd);
      TITAN_CHECK_VALUE(data_ != MAP_FAILED, "[titan::data::Corpus] expected to map {} ({} bytes), got errno {}.",
                        path.string(), size_, errno);
    } else {
      ::close(fd);
    }
  }
  ~MappedFile() {
    if (data_ != nullptr && data_ != MAP_FAILED) ::munmap(data_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::string_view bytes() const {
    return size_ == 0 ? std::string_view() : std::string_view(static_cast<const char*>(data_), size_);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

struct Span {
  uint32_t file;
  uint32_t line;  // 1-based line of the document's start, for error messages
  uint64_t offset;
  uint64_t length;
};

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos; }

// Calls fn(line_without_newline, offset, line_number) for each line of `bytes`.
template <class Fn>
void for_each_line(std::string_view bytes, Fn&& fn) {
  uint64_t offset = 0;
  uint32_t number = 1;
  while (offset < bytes.size()) {
    size_t end = bytes.find('\n', offset);
    if (end == std::string_view::npos) end = bytes.size();
    fn(bytes.substr(offset, end - offset), offset, number++);
    offset = end + 1;
  }
}

// Documents are runs of lines for which `is_separator` is false; each span ends before the newline
// of its last line.
template <class IsSeparator>
void index_blocks(std::string_view bytes, uint32_t file, IsSeparator&& is_separator, std::vector<Span>& out) {
  bool open = false;
  Span current{};
  for_each_line(bytes, [&](std::string_view line, uint64_t offset, uint32_t number) {
    if (is_separator(line)) {
      if (open) out.push_back(current);
      open = false;
      return;
    }
    if (!open) current = {file, number, offset, 0};
    open = true;
    current.length = offset + line.size() - current.offset;
  });
  if (open) out.push_back(current);
}

class FileCorpus final : public Corpus {
 public:
  FileCorpus(std::string name, CorpusSpec spec, const std::vector<fs::path>& paths)
      : name_(std::move(name)), spec_(std::move(spec)) {
    for (const fs::path& p : paths) {
      const auto file = uint32_t(files_.size());
      files_.push_back(std::make_unique<MappedFile>(p));
      const std::string_view bytes = files_.back()->bytes();
      switch (spec_.format) {
        case DatasetFormat::text:
          if (!spec_.split_blank_lines) {
            if (!bytes.empty()) spans_.push_back({file, 1, 0, bytes.size()});
          } else {
            index_blocks(bytes, file, is_blank, spans_);
          }
          break;
        case DatasetFormat::fortunes:
          index_blocks(
              bytes, file, [](std::string_view l) { return l == "%" || l == "%\r"; }, spans_);
          break;
        case DatasetFormat::chat:
          TITAN_CHECK_VALUE(false,
                            "[titan::data::open_corpus] dataset \"{}\": expected text, jsonl or fortunes for "
                            "an indexed corpus, got chat. Open chat data with open_source.",
                            name_);
          break;
        case DatasetFormat::jsonl:
          for_each_line(bytes, [&](std::string_view line, uint64_t offset, uint32_t number) {
            if (!is_blank(line)) spans_.push_back({file, number, offset, line.size()});
          });
          break;
      }
    }
  }

  const std::string& name() const override { return name_; }
  int64_t size() const override { return int64_t(spans_.size()); }

  std::string document(int64_t index) const override {
    TITAN_CHECK_VALUE(index >= 0 && index < size(),
                      "[titan::data::Corpus] {}: expected a document index in [0, {}), got {}.", name_, size(), index);
    const Span& s = spans_[size_t(index)];
    const MappedFile& file = *files_[s.file];
    const std::string_view raw = file.bytes().substr(s.offset, s.length);
    if (spec_.format != DatasetFormat::jsonl) return std::string(raw);
    nlohmann::json obj;
    try {
      obj = nlohmann::json::parse(raw);
    } catch (const nlohmann::json::parse_error& e) {
      TITAN_CHECK_VALUE(false,
                        "[titan::data::Corpus] {}:{}: expected one JSON object per line, got a syntax error at "
                        "byte {} of the line: {}",
                        file.path().string(), s.line, e.byte, e.what());
    }
    const bool ok = obj.is_object() && obj.contains(spec_.text_field) && obj.at(spec_.text_field).is_string();
    TITAN_CHECK_VALUE(
        ok,
        "[titan::data::Corpus] {}:{}: expected a string field \"{}\", got {}. Set the dataset's "
        "text_field to the key holding the text.",
        file.path().string(), s.line, spec_.text_field,
        obj.is_object() && obj.contains(spec_.text_field) ? obj.at(spec_.text_field).type_name() : "no such key");
    return obj.at(spec_.text_field).get<std::string>();
  }

  std::vector<std::pair<fs::path, uintmax_t>> files() const override {
    std::vector<std::pair<fs::path, uintmax_t>> out;
    for (const auto& f : files_) out.emplace_back(f->path(), f->bytes().size());
    return out;
  }

 private:
  std::string name_;
  CorpusSpec spec_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<Span> spans_;
};

class MemoryCorpus final : public Corpus {
 public:
  MemoryCorpus(std::string name, std::vector<std::string> docs) : name_(std::move(name)), docs_(std::move(docs)) {}
  const std::string& name() const override { return name_; }
  int64_t size() const override { return int64_t(docs_.size()); }
  std::string document(int64_t index) const override {
    TITAN_CHECK_VALUE(index >= 0 && index < size(),
                      "[titan::data::Corpus] {}: expected a document index in [0, {}), got {}.", name_, size(), index);
    return docs_[size_t(index)];
  }
  std::vector<std::pair<fs::path, uintmax_t>> files() const override { return {}; }

 private:
  std::string name_;
  std::vector<std::string> docs_;
};

bool wanted(const fs::path& p, DatasetFormat format) {
  const std::string name = p.filename().string();
  if (name.starts_with('.')) return false;
  // A compressed shard is judged by the name under the compression suffix.
  const fs::path inner = p.extension() == ".gz" || p.extension() == ".zst" ? p.stem() : p;
  switch (format) {
    case DatasetFormat::text:
      return true;
    case DatasetFormat::jsonl:
    case DatasetFormat::chat:
      return inner.extension() == ".jsonl" || inner.extension() == ".json";
    case DatasetFormat::fortunes:
      return !p.has_extension();  // skips the .dat indexes and .u8 links
  }
  return false;
}

bool is_glob(const fs::path& p) { return p.string().find_first_of("*?[") != std::string::npos; }

std::vector<fs::path> glob_files(const fs::path& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<fs::path> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  return out;  // glob(3) sorts its matches
}

}  // namespace

std::vector<fs::path> list_corpus_files(const CorpusSpec& spec) {
  if (is_glob(spec.path)) return glob_files(spec.path);
  if (!fs::is_directory(spec.path)) return {spec.path};
  std::vector<fs::path> out;
  for (auto it = fs::recursive_directory_iterator(spec.path); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    // fortunes' off/ holds the offensive (rot13-encoded) collection.
    if (it->is_directory() && (name.starts_with('.') || (spec.format == DatasetFormat::fortunes && name == "off"))) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && wanted(it->path(), spec.format)) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::shared_ptr<Corpus> open_corpus(std::string name, const CorpusSpec& spec) {
  TITAN_CHECK_VALUE(fs::exists(spec.path) || is_glob(spec.path),
                    "[titan::data::open_corpus] dataset \"{}\": expected a file or folder at {}, "
                    "got nothing there. Set training.dataset_path to where the data is.",
                    name, spec.path.string());
  const std::vector<fs::path> paths = list_corpus_files(spec);
  auto corpus = std::make_shared<FileCorpus>(name, spec, paths);
  TITAN_CHECK_VALUE(corpus->size() > 0,
                    "[titan::data::open_corpus] dataset \"{}\" at {}: expected at least one "
                    "document, got none in {} file(s). Check the path and the format (text, jsonl, fortunes).",
                    name, spec.path.string(), paths.size());
  return corpus;
}

std::shared_ptr<Corpus> make_corpus(std::string name, std::vector<std::string> documents) {
  TITAN_CHECK_VALUE(!documents.empty(),
                    "[titan::data::make_corpus] dataset \"{}\": expected at least one document, "
                    "got none.",
                    name);
  return std::make_shared<MemoryCorpus>(std::move(name), std::move(documents));
}

}  // namespace titan::data
