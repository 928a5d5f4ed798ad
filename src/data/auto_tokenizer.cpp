// SPDX-License-Identifier: BSD-3-Clause
// tokenizer_for: load, or train once and cache (see auto_tokenizer.hpp).
#include "titan/data/auto_tokenizer.hpp"

#include <unistd.h>

#include <chrono>
#include <random>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/data/bpe_tokenizer.hpp"

namespace titan::data {
namespace {

namespace fs = std::filesystem;

struct Fnv1a {
  uint64_t h = 0xcbf29ce484222325ull;
  void add(std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    h = (h ^ 0xff) * 0x100000001b3ull;  // separator, so ("ab","c") != ("a","bc")
  }
};

// What the cached tokenizer depends on: the corpus (its files and sizes, or its text when it has no
// files) and every trainer setting.
uint64_t cache_key(const Corpus& corpus, const AutoTokenizerOptions& options, int64_t vocab_size) {
  Fnv1a h;
  h.add(corpus.name());
  const auto files = corpus.files();
  for (const auto& [path, size] : files) {
    h.add(path.string());
    h.add(std::to_string(size));
  }
  if (files.empty()) {
    for (int64_t i = 0; i < corpus.size(); ++i) h.add(corpus.document(i));
  }
  h.add(std::to_string(vocab_size));
  h.add(std::to_string(options.max_training_bytes));
  h.add(std::to_string(int(options.trainer.split)));
  for (const std::string& s : options.trainer.special_tokens) h.add(s);
  h.add(options.trainer.bos_token);
  h.add(options.trainer.eos_token);
  h.add(options.trainer.pad_token);
  return h.h;
}

std::shared_ptr<Tokenizer> train(const Corpus& corpus, int64_t vocab_size, const fs::path& dir,
                                 const AutoTokenizerOptions& options) {
  BpeTrainerConfig config = options.trainer;
  config.vocab_size = vocab_size;
  BpeTrainer trainer(config);
  const auto start = std::chrono::steady_clock::now();
  int64_t docs = 0;
  for (; docs < corpus.size() && trainer.bytes_seen() < options.max_training_bytes; ++docs) {
    trainer.add_text(corpus.document(docs));
  }
  const TrainedBpe bpe = trainer.train();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log::info("tokenizer: trained a byte-level BPE of {} tokens on {} documents ({:.1f} MB) of {} in {:.1f} s",
            bpe.vocab.size(), docs, double(trainer.bytes_seen()) / 1e6, corpus.name(), seconds);

  // Publish the whole folder with one rename so a concurrent reader never sees half of it.
  std::random_device rd;
  const fs::path tmp = dir.parent_path() /
                       fmt::format(".{}.tmp.{}.{:08x}", dir.filename().string(), static_cast<long>(::getpid()), rd());
  bpe.save(tmp);
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp);
    TITAN_CHECK_VALUE(fs::exists(dir / "tokenizer.json"),
                      "[titan::data::tokenizer_for] expected to publish the "
                      "trained tokenizer at {}, got: {}. Check that the cache folder is writable.",
                      dir.string(), ec.message());
  }
  log::info("tokenizer: cached at {}", dir.string());
  return BpeTokenizer::from_files(dir / "tokenizer.json", dir / "tokenizer_config.json");
}

}  // namespace

std::shared_ptr<Tokenizer> tokenizer_for(const fs::path& hf_assets_path, const Corpus& corpus, int64_t vocab_size,
                                         const fs::path& cache_dir, const AutoTokenizerOptions& options) {
  if (!hf_assets_path.empty()) {
    const bool has = fs::is_directory(hf_assets_path) ? fs::exists(hf_assets_path / "tokenizer.json") ||
                                                            fs::exists(hf_assets_path / "tokenizer.model")
                                                      : fs::is_regular_file(hf_assets_path);
    if (has) return load_tokenizer(hf_assets_path);
    log::info("tokenizer: no tokenizer.json at {}; using a BPE trained on dataset {}", hf_assets_path.string(),
              corpus.name());
  }
  TITAN_CHECK_VALUE(!cache_dir.empty(),
                    "[titan::data::tokenizer_for] expected a cache folder for the trained "
                    "tokenizer, got an empty path.");
  const fs::path dir =
      cache_dir / fmt::format("{}-v{}-{:016x}", corpus.name(), vocab_size, cache_key(corpus, options, vocab_size));
  if (fs::exists(dir / "tokenizer.json")) {
    log::info("tokenizer: reusing the BPE trained on {} at {}", corpus.name(), dir.string());
    return BpeTokenizer::from_files(dir / "tokenizer.json", dir / "tokenizer_config.json");
  }
  fs::create_directories(cache_dir);
  return train(corpus, vocab_size, dir, options);
}

}  // namespace titan::data
