// SPDX-License-Identifier: BSD-3-Clause
// titan-tokenizer: trains a tokenizer on a corpus.
//   titan-tokenizer train --output DIR [--type bpe|sentencepiece] [--vocab-size N] [--max-bytes N]
//                         [--model-type bpe|unigram]   (sentencepiece only)
//                         [--input PATH] [--training.dataset_format text|jsonl|fortunes]
//                         [--training.dataset_text_field KEY] [--job.config_file FILE ...]
// The corpus is PATH (a file, a folder or a glob of shards, .gz / .zst too; text unless
// training.dataset_format says otherwise) or, without --input, the job's own dataset (training.dataset,
// dataset_path, dataset_mixture's first entry), read as the trainer reads it. bpe writes DIR/tokenizer.json
// and tokenizer_config.json (Hugging Face format); sentencepiece writes DIR/tokenizer.model. Either
// loads with model.hf_assets_path = DIR.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/tool_args.hpp"
#include "titan/data/bpe_trainer.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/data/sentencepiece_tokenizer.hpp"
#include "titan/data/source.hpp"
#include "titan/train/data_setup.hpp"

namespace fs = std::filesystem;

namespace {

const titan::ToolSpec kSpec = {
    .name = "titan-tokenizer",
    .usage =
        "usage: titan-tokenizer train --output DIR [--input PATH] [--type bpe|sentencepiece] [--vocab-size N]\n"
        "         [--max-bytes N] [--model-type bpe|unigram] [--training.dataset_format text|jsonl|fortunes]\n"
        "         [--training.dataset_text_field KEY] [--job.config_file FILE ...]\n",
    .flags = {{.name = "--output", .value = "DIR", .help = "the folder to write the tokenizer to"},
              {.name = "--input",
               .value = "PATH",
               .help = "a file, folder or glob of the corpus (default: the job's dataset, as the trainer reads it)"},
              {.name = "--type", .value = "bpe|sentencepiece", .help = "the tokenizer to train (default bpe)"},
              {.name = "--vocab-size", .value = "N", .help = "entries in the vocabulary (default 8000)"},
              {.name = "--max-bytes", .value = "N", .help = "train on at most this many bytes of text (default 1e8)"},
              {.name = "--model-type", .value = "bpe|unigram", .help = "sentencepiece's model (default bpe)"}},
    .renamed = {{.flag = "--format", .instead = "--training.dataset_format text|jsonl|fortunes"},
                {.flag = "--text-field", .instead = "--training.dataset_text_field KEY"}},
    .keys =
        "training.dataset_format, training.dataset_text_field, training.dataset_on_bad_record; without --input "
        "training.dataset, dataset_path and dataset_mixture",
    .words = "the command (train)"};

// --input read in the job's format (text unless set), else the job's first dataset.
std::shared_ptr<titan::data::Source> corpus_of(const titan::ToolArgs& args) {
  const titan::TrainingConfig& t = args.config.training;
  const std::optional<std::string> input = args.value("--input");
  if (!input) return titan::build_sources(args.config).front().source;
  return titan::data::open_source("input", {.format = t.dataset_format.value_or(titan::DatasetFormat::text),
                                            .path = *input,
                                            .text_field = t.dataset_text_field.value_or("text"),
                                            .on_bad_record = t.dataset_on_bad_record});
}

}  // namespace

int main(int argc, char** argv) {
  return titan::run_tool(kSpec, argc, argv, [&](const titan::ToolArgs& args) {
    TITAN_CHECK_VALUE(args.words.size() == 1 && args.words[0] == "train",
                      "[titan-tokenizer] expected the command train before the flags, got '{}'.\n{}",
                      fmt::join(args.words, " "), kSpec.usage);
    const fs::path output = args.required("--output");
    const int64_t vocab = args.integer("--vocab-size", 8000);
    const std::string type = args.value("--type").value_or("bpe");
    TITAN_CHECK_VALUE(type == "bpe" || type == "sentencepiece",
                      "[titan-tokenizer] expected --type bpe or sentencepiece, got '{}'.", type);
    const auto corpus = titan::data::sample_corpus(*corpus_of(args), args.integer("--max-bytes", 100'000'000));
    fs::create_directories(output);
    if (type == "bpe") {
      titan::data::BpeTrainer trainer({.vocab_size = vocab});
      for (int64_t i = 0; i < corpus->size(); ++i) trainer.add_text(corpus->document(i));
      trainer.train().save(output);
      titan::log::info("wrote {}", (output / "tokenizer.json").string());
      return 0;
    }
    // The sentencepiece trainer reads lines of text files: one document per line.
    const fs::path lines = output / "tokenizer.train.txt";
    {
      std::ofstream out(lines, std::ios::binary);
      for (int64_t i = 0; i < corpus->size(); ++i) out << corpus->document(i) << '\n';
    }
    const fs::path model = titan::data::train_sentencepiece(
        {lines}, output / "tokenizer", {.vocab_size = vocab, .model_type = args.value("--model-type").value_or("bpe")});
    fs::remove(lines);
    titan::log::info("wrote {}", model.string());
    return 0;
  });
}
