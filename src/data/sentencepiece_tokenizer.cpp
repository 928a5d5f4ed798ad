// SPDX-License-Identifier: BSD-3-Clause
// SentencePieceTokenizer: a thin adapter over libsentencepiece (see sentencepiece_tokenizer.hpp).
#include "titan/data/sentencepiece_tokenizer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"

namespace titan::data {
namespace {

namespace fs = std::filesystem;

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const fs::path& model) {
    TITAN_CHECK_VALUE(fs::is_regular_file(model),
                      "[titan::data::load_sentencepiece] expected a sentencepiece .model "
                      "file at {}, got no such file.",
                      model.string());
    const auto status = processor_.Load(model.string());
    TITAN_CHECK_VALUE(status.ok(), "[titan::data::load_sentencepiece] {}: expected a sentencepiece model, got \"{}\".",
                      model.string(), status.ToString());
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const override {
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    TITAN_CHECK_VALUE(status.ok(), "[titan::data::SentencePieceTokenizer] expected to encode the text, got \"{}\".",
                      status.ToString());
    std::vector<int32_t> out;
    out.reserve(ids.size() + 2);
    if (add_bos && bos_id()) out.push_back(*bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    if (add_eos && eos_id()) out.push_back(*eos_id());
    return out;
  }

  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    std::vector<int> kept;
    for (int32_t id : ids) {
      if (id < 0 || id >= processor_.GetPieceSize()) continue;  // as HF: ids without a token are skipped
      if (skip_special_tokens && (processor_.IsControl(id) || processor_.IsUnknown(id))) continue;
      kept.push_back(id);
    }
    std::string text;
    const auto status = processor_.Decode(kept, &text);
    TITAN_CHECK_VALUE(status.ok(), "[titan::data::SentencePieceTokenizer] expected to decode ids, got \"{}\".",
                      status.ToString());
    return text;
  }

  int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  std::optional<int32_t> bos_id() const override { return id_or_none(processor_.bos_id()); }
  std::optional<int32_t> eos_id() const override { return id_or_none(processor_.eos_id()); }

  std::optional<int32_t> token_to_id(std::string_view token) const override {
    const int id = processor_.PieceToId(token);
    // PieceToId answers unk for unknown pieces; only the unk piece itself maps to it.
    if (processor_.IsUnknown(id) && processor_.IdToPiece(id) != token) return std::nullopt;
    return id;
  }
  std::optional<std::string> id_to_token(int32_t id) const override {
    if (id < 0 || id >= processor_.GetPieceSize()) return std::nullopt;
    return processor_.IdToPiece(id);
  }

 private:
  static std::optional<int32_t> id_or_none(int id) { return id >= 0 ? std::optional<int32_t>(id) : std::nullopt; }

  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace

std::shared_ptr<Tokenizer> load_sentencepiece(const fs::path& model_file) {
  auto tok = std::make_shared<SentencePieceTokenizer>(model_file);
  log::info("tokenizer: sentencepiece {} (vocab {})", model_file.string(), tok->vocab_size());
  return tok;
}

fs::path train_sentencepiece(const std::vector<fs::path>& inputs, const fs::path& model_prefix,
                             const SentencePieceTrainerConfig& config) {
  TITAN_CHECK_VALUE(!inputs.empty(), "[titan::data::train_sentencepiece] expected input text files, got none.");
  std::vector<std::string> files;
  for (const fs::path& p : inputs) files.push_back(p.string());
  // The trainer takes one flag string; paths with commas or spaces would be split, so refuse them.
  for (const std::string& f : files) {
    TITAN_CHECK_VALUE(f.find_first_of(", ") == std::string::npos,
                      "[titan::data::train_sentencepiece] expected input "
                      "paths without commas or spaces, got \"{}\". Rename or link the file.",
                      f);
  }
  const std::string args = fmt::format(
      "--input={} --model_prefix={} --vocab_size={} --model_type={} --character_coverage={} --byte_fallback={} "
      "--input_sentence_size={} --max_sentence_length={} --num_threads={} --minloglevel=1",
      fmt::join(files, ","), model_prefix.string(), config.vocab_size, config.model_type, config.character_coverage,
      config.byte_fallback ? "true" : "false", config.input_sentence_size, config.max_sentence_length,
      config.num_threads);
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  TITAN_CHECK_VALUE(status.ok(), "[titan::data::train_sentencepiece] expected training to succeed, got \"{}\".",
                    status.ToString());
  return fs::path(model_prefix.string() + ".model");
}

}  // namespace titan::data
