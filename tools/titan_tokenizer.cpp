// SPDX-License-Identifier: BSD-3-Clause
// titan-tokenizer: trains a tokenizer on a corpus.
//   titan-tokenizer train --type bpe|sentencepiece --input PATH --output DIR [--vocab-size N]
//                         [--format text|jsonl|fortunes] [--text-field KEY] [--max-bytes N]
//                         [--model-type bpe|unigram]   (sentencepiece only)
// PATH is a file, a folder or a glob of shards (.gz / .zst too). bpe writes DIR/tokenizer.json and
// tokenizer_config.json (Hugging Face format); sentencepiece writes DIR/tokenizer.model. Either
// loads with model.hf_assets_path = DIR.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "titan/core/log.hpp"
#include "titan/data/bpe_trainer.hpp"
#include "titan/data/sentencepiece_tokenizer.hpp"
#include "titan/data/source.hpp"

namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: titan-tokenizer train --type bpe|sentencepiece --input PATH --output DIR [--vocab-size N]\n"
    "         [--format text|jsonl|fortunes] [--text-field KEY] [--max-bytes N] [--model-type bpe|unigram]\n";

std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> flags = {
      {"type", "bpe"},        {"vocab-size", "8000"},     {"format", "text"},
      {"text-field", "text"}, {"max-bytes", "100000000"}, {"model-type", "bpe"}};
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const bool known =
        key.starts_with("--") && (flags.contains(key.substr(2)) || key == "--input" || key == "--output");
    if (!known) {
      throw std::invalid_argument(fmt::format("unknown flag {}\n{}", key, kUsage));
    }
    flags[key.substr(2)] = argv[i + 1];
  }
  if (!flags.contains("input") || !flags.contains("output")) throw std::invalid_argument(kUsage);
  return flags;
}

titan::DatasetFormat format_of(const std::string& name) {
  const std::optional<titan::DatasetFormat> format = titan::parse_choice<titan::DatasetFormat>(name);
  if (!format) {
    throw std::invalid_argument(fmt::format("[titan-tokenizer] expected --format {}, got '{}'.",
                                            titan::choice_list<titan::DatasetFormat>(), name));
  }
  return *format;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2 || std::string(argv[1]) != "train") throw std::invalid_argument(kUsage);
    const auto flags = parse(argc, argv);
    const fs::path output = flags.at("output");
    const int64_t vocab = std::stoll(flags.at("vocab-size"));
    const int64_t max_bytes = std::stoll(flags.at("max-bytes"));
    auto source = titan::data::open_source(
        "input",
        {.format = format_of(flags.at("format")), .path = flags.at("input"), .text_field = flags.at("text-field")});
    const auto corpus = titan::data::sample_corpus(*source, max_bytes);
    fs::create_directories(output);
    if (flags.at("type") == "bpe") {
      titan::data::BpeTrainer trainer({.vocab_size = vocab});
      for (int64_t i = 0; i < corpus->size(); ++i) trainer.add_text(corpus->document(i));
      trainer.train().save(output);
      titan::log::info("wrote {}", (output / "tokenizer.json").string());
    } else if (flags.at("type") == "sentencepiece") {
      // The sentencepiece trainer reads lines of text files: one document per line.
      const fs::path lines = output / "tokenizer.train.txt";
      {
        std::ofstream out(lines, std::ios::binary);
        for (int64_t i = 0; i < corpus->size(); ++i) out << corpus->document(i) << '\n';
      }
      const fs::path model = titan::data::train_sentencepiece(
          {lines}, output / "tokenizer", {.vocab_size = vocab, .model_type = flags.at("model-type")});
      fs::remove(lines);
      titan::log::info("wrote {}", model.string());
    } else {
      throw std::invalid_argument(fmt::format("--type must be bpe or sentencepiece, got {}", flags.at("type")));
    }
    return 0;
  } catch (const std::exception& e) {
    titan::log::error("{}", e.what());
    return 1;
  }
}
