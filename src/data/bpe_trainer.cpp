// SPDX-License-Identifier: BSD-3-Clause
// BPE training on a word-frequency table with incremental pair counts: each merge only revisits
// the words that contain the merged pair, and a lazy max-heap picks the next most frequent pair.
#include "titan/data/bpe_trainer.hpp"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <queue>
#include <unordered_map>

#include "bpe_model.hpp"
#include "json_file.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"

namespace titan::data {
namespace {

using nlohmann::json;
uint64_t pair_key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }

struct Candidate {
  int64_t count;
  int32_t left, right;
  // Max-heap order: higher count first, then smaller ids (deterministic ties).
  bool operator<(const Candidate& o) const {
    if (count != o.count) return count < o.count;
    return std::pair(left, right) > std::pair(o.left, o.right);
  }
};

class MergeLearner {
 public:
  MergeLearner(const detail::StringMap<int64_t>& word_counts) {
    words_.reserve(word_counts.size());
    for (const auto& [word, count] : word_counts) {
      std::vector<int32_t> symbols(word.begin(), word.end());
      for (int32_t& s : symbols) s = int32_t(uint8_t(s));
      words_.push_back({std::move(symbols), count, 0});
    }
    for (int32_t w = 0; w < int32_t(words_.size()); ++w) {
      const Word& word = words_[w];
      for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
        const uint64_t key = pair_key(word.symbols[i], word.symbols[i + 1]);
        counts_[key] += word.count;
        where_[key].push_back(w);
      }
    }
    for (const auto& [key, count] : counts_) heap_.push({count, int32_t(key >> 32), int32_t(uint32_t(key))});
  }

  // The most frequent pair, or nullopt when none is left.
  std::optional<std::pair<int32_t, int32_t>> best() {
    while (!heap_.empty()) {
      Candidate top = heap_.top();
      heap_.pop();
      const auto it = counts_.find(pair_key(top.left, top.right));
      const int64_t current = it == counts_.end() ? 0 : it->second;
      if (current == top.count && current > 0) return std::pair(top.left, top.right);
      if (current > 0) heap_.push({current, top.left, top.right});
    }
    return std::nullopt;
  }

  // Replaces every (left, right) by `merged` and updates the pair counts of the words touched.
  void apply(int32_t left, int32_t right, int32_t merged) {
    const uint64_t key = pair_key(left, right);
    std::vector<int32_t> touched = std::move(where_[key]);
    where_.erase(key);
    ++stamp_;
    std::vector<uint64_t> grown;
    for (int32_t w : touched) {
      Word& word = words_[w];
      if (word.stamp == stamp_) continue;  // listed twice
      word.stamp = stamp_;
      auto& s = word.symbols;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        if (s[i] != left || s[i + 1] != right) continue;
        add(key, -word.count);
        if (i > 0) {
          add(pair_key(s[i - 1], left), -word.count);
          grown.push_back(add(pair_key(s[i - 1], merged), word.count, w));
        }
        if (i + 2 < s.size()) {
          add(pair_key(right, s[i + 2]), -word.count);
          grown.push_back(add(pair_key(merged, s[i + 2]), word.count, w));
        }
        s[i] = merged;
        s.erase(s.begin() + std::ptrdiff_t(i) + 1);
      }
    }
    counts_.erase(key);
    std::sort(grown.begin(), grown.end());
    grown.erase(std::unique(grown.begin(), grown.end()), grown.end());
    for (uint64_t k : grown) {
      if (auto it = counts_.find(k); it != counts_.end() && it->second > 0) {
        heap_.push({it->second, int32_t(k >> 32), int32_t(uint32_t(k))});
      }
    }
  }

 private:
  struct Word {
    std::vector<int32_t> symbols;
    int64_t count;
    uint64_t stamp;
  };
  uint64_t add(uint64_t key, int64_t delta, int32_t word = -1) {
    counts_[key] += delta;
    if (word >= 0) where_[key].push_back(word);
    return key;
  }

  std::vector<Word> words_;
  std::unordered_map<uint64_t, int64_t> counts_;
  std::unordered_map<uint64_t, std::vector<int32_t>> where_;  // pair -> words that had it (maybe stale)
  std::priority_queue<Candidate> heap_;
  uint64_t stamp_ = 0;
};

json added_token_json(int32_t id, const std::string& content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

}  // namespace

struct BpeTrainer::Impl {
  BpeTrainerConfig config;
  detail::StringMap<int64_t> word_counts;
  int64_t bytes = 0;
};

BpeTrainer::BpeTrainer(BpeTrainerConfig config) : impl_(std::make_unique<Impl>()) {
  const auto n_special = int64_t(config.special_tokens.size());
  TITAN_CHECK_VALUE(config.vocab_size >= 256 + n_special,
                    "[titan::data::BpeTrainer] expected vocab_size >= 256 bytes + {} special tokens = {}, got {}. "
                    "Raise the vocabulary size.",
                    n_special, 256 + n_special, config.vocab_size);
  TITAN_CHECK_VALUE(config.split != SplitPattern::none,
                    "[titan::data::BpeTrainer] expected split gpt2 or llama3, got none. Byte-level BPE needs a split.");
  for (const std::string* name : {&config.bos_token, &config.eos_token, &config.pad_token}) {
    const auto& sp = config.special_tokens;
    TITAN_CHECK_VALUE(name->empty() || std::find(sp.begin(), sp.end(), *name) != sp.end(),
                      "[titan::data::BpeTrainer] expected bos/eos/pad token {:?} to be one of special_tokens [{:?}]. "
                      "Add it there.",
                      *name, fmt::join(sp, ", "));
  }
  impl_->config = std::move(config);
}

BpeTrainer::~BpeTrainer() = default;
BpeTrainer::BpeTrainer(BpeTrainer&&) noexcept = default;
BpeTrainer& BpeTrainer::operator=(BpeTrainer&&) noexcept = default;

void BpeTrainer::add_text(std::string_view text) {
  std::vector<std::string_view> pieces;
  split_pieces(text, impl_->config.split, pieces);
  for (std::string_view piece : pieces) {
    auto it = impl_->word_counts.find(piece);
    if (it == impl_->word_counts.end()) it = impl_->word_counts.emplace(std::string(piece), 0).first;
    ++it->second;
  }
  impl_->bytes += int64_t(text.size());
}

int64_t BpeTrainer::bytes_seen() const { return impl_->bytes; }

TrainedBpe BpeTrainer::train() const {
  const BpeTrainerConfig& config = impl_->config;
  TrainedBpe out;
  out.config = config;
  detail::StringMap<int32_t> ids;
  for (int b = 0; b < 256; ++b) {
    out.vocab.push_back(to_byte_level(std::string(1, char(b))));
    ids.emplace(out.vocab.back(), b);
  }
  const int64_t target = config.vocab_size - int64_t(config.special_tokens.size());
  MergeLearner learner(impl_->word_counts);
  while (int64_t(out.vocab.size()) < target) {
    const auto best = learner.best();
    if (!best) break;
    const auto [left, right] = *best;
    // Two different pairs can spell the same token ("a"+"bc", "ab"+"c"): it keeps one id, as in HF.
    std::string token = out.vocab[left] + out.vocab[right];
    auto [it, inserted] = ids.emplace(token, int32_t(out.vocab.size()));
    if (inserted) out.vocab.push_back(std::move(token));
    out.merges.emplace_back(left, right);
    learner.apply(left, right, it->second);
  }
  if (int64_t(out.vocab.size()) < target) {
    log::warn(
        "[titan::data::BpeTrainer] the text ({} bytes) ran out of pairs at {} tokens; the vocabulary has {} "
        "entries instead of {}. Train on more text or ask for fewer.",
        impl_->bytes, out.vocab.size(), out.vocab.size() + config.special_tokens.size(), config.vocab_size);
  }
  for (const std::string& special : config.special_tokens) out.vocab.push_back(special);
  return out;
}

json TrainedBpe::tokenizer_json() const {
  json vocab_json = json::object();
  for (size_t id = 0; id < vocab.size(); ++id) vocab_json[vocab[id]] = id;
  json merges_json = json::array();
  for (const auto& [a, b] : merges) merges_json.push_back({vocab[a], vocab[b]});
  json added = json::array();
  const size_t first_special = vocab.size() - config.special_tokens.size();
  for (size_t i = 0; i < config.special_tokens.size(); ++i) {
    added.push_back(added_token_json(int32_t(first_special + i), config.special_tokens[i]));
  }
  json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", config.split == SplitPattern::gpt2}};
  json pre_tokenizer = byte_level;
  if (config.split != SplitPattern::gpt2) {
    json split = {{"type", "Split"},
                  {"pattern", {{"Regex", std::string(split_pattern_regex(config.split))}}},
                  {"behavior", "Isolated"},
                  {"invert", false}};
    pre_tokenizer = {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}};
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab_json},
            {"merges", merges_json}}}};
}

json TrainedBpe::tokenizer_config_json() const {
  json decoder = json::object();
  const size_t first_special = vocab.size() - config.special_tokens.size();
  for (size_t i = 0; i < config.special_tokens.size(); ++i) {
    json entry = added_token_json(int32_t(first_special + i), config.special_tokens[i]);
    entry.erase("id");
    decoder[std::to_string(first_special + i)] = entry;
  }
  json out = {{"added_tokens_decoder", decoder},
              {"tokenizer_class", "PreTrainedTokenizerFast"},
              {"clean_up_tokenization_spaces", false},
              {"model_max_length", 1 << 20}};
  for (auto [key, value] : {std::pair{"bos_token", &config.bos_token}, std::pair{"eos_token", &config.eos_token},
                            std::pair{"pad_token", &config.pad_token}}) {
    if (!value->empty()) out[key] = *value;
  }
  return out;
}

void TrainedBpe::save(const std::filesystem::path& dir) const {
  std::filesystem::create_directories(dir);
  // tokenizer.json last: a reader that finds it finds the config too.
  detail::write_file_atomic(dir / "tokenizer_config.json", tokenizer_config_json().dump(2));
  detail::write_file_atomic(dir / "tokenizer.json", tokenizer_json().dump(2));
}

std::shared_ptr<BpeTokenizer> TrainedBpe::tokenizer() const {
  const json config = tokenizer_config_json();
  return BpeTokenizer::from_json(tokenizer_json(), "<trained BPE>", &config, "<trained BPE config>");
}

}  // namespace titan::data
