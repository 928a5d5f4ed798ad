// SPDX-License-Identifier: BSD-3-Clause
// Reading a Hugging Face tokenizer.json (+ tokenizer_config.json) into a BpeTokenizer. Anything we
// cannot encode exactly as HF does is refused with the key that made us refuse it.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>

#include "bpe_tokenizer_impl.hpp"
#include "json_file.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"

namespace titan::data {
namespace {

using nlohmann::json;
constexpr std::string_view kWhere = "titan::data::BpeTokenizer";

// Typed access to a JSON document with errors of the form
// [titan::data::BpeTokenizer] <file>: expected <what> at "<key>", got <value>. <hint>
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}
  const std::string& source() const { return source_; }

  void check(bool ok, std::string_view key, std::string_view expected, const json& got,
             std::string_view hint = "") const {
    TITAN_CHECK_VALUE(ok, "[{}] {}: expected {} at \"{}\", got {}.{}{}", kWhere, source_, expected, key, describe(got),
                      hint.empty() ? "" : " ", hint);
  }
  void unsupported(bool ok, std::string_view key, const json& got, std::string_view hint) const {
    TITAN_CHECK_NOT_IMPLEMENTED(ok, "[{}] {}: \"{}\" = {} is not supported. {}", kWhere, source_, key, describe(got),
                                hint);
  }
  const json& member(const json& obj, std::string_view parent, const char* key) const {
    check(obj.is_object() && obj.contains(key), fmt::format("{}{}{}", parent, parent.empty() ? "" : ".", key),
          "a value", json(), "Is this a Hugging Face tokenizer.json?");
    return obj.at(key);
  }
  std::string string(const json& v, std::string_view key) const {
    check(v.is_string(), key, "a string", v);
    return v.get<std::string>();
  }
  bool flag(const json& obj, const char* key, bool fallback, std::string_view where) const {
    if (!obj.is_object() || !obj.contains(key) || obj.at(key).is_null()) return fallback;
    const json& v = obj.at(key);
    check(v.is_boolean(), fmt::format("{}.{}", where, key), "true or false", v);
    return v.get<bool>();
  }
  std::string type(const json& obj, std::string_view where) const {
    check(obj.is_object() && obj.contains("type"), fmt::format("{}.type", where), "an object with a \"type\"", obj);
    return string(obj.at("type"), fmt::format("{}.type", where));
  }

  static std::string describe(const json& v) {
    if (v.is_null()) return "nothing";
    std::string s = v.dump();
    return s.size() > 80 ? s.substr(0, 77) + "..." : s;
  }

 private:
  std::string source_;
};

void read_model(const Reader& r, const json& model, BpeTokenizer::Impl& impl) {
  const std::string type = r.type(model, "model");
  r.check(type == "BPE", "model.type", "\"BPE\"", type, "titan reads byte-level BPE tokenizers only.");
  const json& vocab_json = r.member(model, "model", "vocab");
  r.check(vocab_json.is_object(), "model.vocab", "an object {token: id}", vocab_json);
  detail::StringMap<int32_t> vocab;
  vocab.reserve(vocab_json.size());
  for (const auto& [token, id] : vocab_json.items()) {
    // Messages are built only on failure: a Llama 3 vocab has 128k entries and 280k merges.
    const auto key = [&] { return fmt::format("model.vocab[{}]", json(token).dump()); };
    if (!(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t(1) << 31))) {
      r.check(false, key(), "a token id in [0, 2^31)", id);
    }
    const auto i = id.get<int32_t>();
    if (size_t(i) >= impl.model_tokens.size()) impl.model_tokens.resize(size_t(i) + 1);
    if (!impl.model_tokens[i].empty()) {
      r.check(false, key(), fmt::format("an id not used by {}", json(impl.model_tokens[i]).dump()), id);
    }
    impl.model_tokens[i] = token;
    vocab.emplace(token, i);
  }

  const json& merges_json = r.member(model, "model", "merges");
  r.check(merges_json.is_array(), "model.merges", "an array of \"a b\" strings or [a, b] pairs", merges_json);
  std::vector<detail::BpeMerge> merges;
  merges.reserve(merges_json.size());
  for (size_t i = 0; i < merges_json.size(); ++i) {
    const json& m = merges_json[i];
    const auto key = [i] { return fmt::format("model.merges[{}]", i); };
    std::string left, right;
    if (m.is_string()) {
      const auto& s = m.get_ref<const std::string&>();
      if (s.starts_with("#version")) continue;
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        r.check(false, key(), "two tokens separated by one space", m);
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else {
      if (!(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())) {
        r.check(false, key(), "a pair of token strings", m);
      }
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    }
    const std::string merged = left + right;
    for (const std::string* t : std::array<const std::string*, 3>{&left, &right, &merged}) {
      if (!vocab.contains(*t)) {
        r.check(false, key(), fmt::format("merge parts in model.vocab ({} is not)", json(*t).dump()), m,
                "The merges do not belong to this vocab; the file is corrupt.");
      }
    }
    merges.push_back({vocab.at(left), vocab.at(right), vocab.at(merged)});
  }

  detail::BpeModelOptions options;
  options.ignore_merges = r.flag(model, "ignore_merges", false, "model");
  options.fuse_unk = r.flag(model, "fuse_unk", false, "model");
  if (model.contains("unk_token") && !model.at("unk_token").is_null()) {
    const std::string unk = r.string(model.at("unk_token"), "model.unk_token");
    r.check(vocab.contains(unk), "model.unk_token", "a token in model.vocab", unk);
    options.unk_id = vocab.at(unk);
  }
  r.unsupported(!r.flag(model, "byte_fallback", false, "model"), "model.byte_fallback", true,
                "Byte-level BPE never needs byte fallback.");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const bool unset = !model.contains(key) || model.at(key).is_null() || model.at(key) == "";
    r.unsupported(unset, fmt::format("model.{}", key), unset ? json() : model.at(key), "Only plain byte-level BPE is.");
  }
  const bool no_dropout = !model.contains("dropout") || model.at("dropout").is_null() || model.at("dropout") == 0;
  r.unsupported(no_dropout, "model.dropout", no_dropout ? json() : model.at("dropout"),
                "BPE dropout is a training-time augmentation; set it to null.");
  impl.model = std::make_unique<detail::BpeModel>(std::move(vocab), merges, options);
}

// Sequences are flattened into `out` as (key, object) pairs.
void flatten_pre_tokenizers(const Reader& r, const json& pt, const std::string& where,
                            std::vector<std::pair<std::string, const json*>>& out) {
  if (r.type(pt, where) != "Sequence") {
    out.emplace_back(where, &pt);
    return;
  }
  const json& list = r.member(pt, where, "pretokenizers");
  r.check(list.is_array(), where + ".pretokenizers", "an array", list);
  for (size_t i = 0; i < list.size(); ++i) {
    flatten_pre_tokenizers(r, list[i], fmt::format("{}.pretokenizers[{}]", where, i), out);
  }
}

PreTokenizerStep read_split(const Reader& r, const json& pt, const std::string& where) {
  const json& pattern = r.member(pt, where, "pattern");
  const json regex = pattern.is_object() ? pattern.value("Regex", json()) : json();
  const auto split = regex.is_string() ? split_pattern_from_regex(regex.get<std::string>()) : std::nullopt;
  r.unsupported(split.has_value(), where + ".pattern", pattern,
                fmt::format("titan has scanners for the GPT-2 regex {} and the Llama 3 regex {} only.",
                            json(split_pattern_regex(SplitPattern::gpt2)).dump(),
                            json(split_pattern_regex(SplitPattern::llama3)).dump()));
  const json behavior = pt.value("behavior", json("Isolated"));
  r.unsupported(behavior == "Isolated", where + ".behavior", behavior, "Only \"Isolated\" is.");
  r.unsupported(!r.flag(pt, "invert", false, where), where + ".invert", true, "Only false is.");
  return {false, *split};
}

void read_pre_tokenizer(const Reader& r, const json& root, BpeTokenizer::Impl& impl) {
  const json& pt = r.member(root, "", "pre_tokenizer");
  std::vector<std::pair<std::string, const json*>> items;
  if (!pt.is_null()) flatten_pre_tokenizers(r, pt, "pre_tokenizer", items);
  const bool byte_level_last = !items.empty() && r.type(*items.back().second, items.back().first) == "ByteLevel";
  r.unsupported(byte_level_last, "pre_tokenizer", pt,
                "titan reads byte-level BPE: the pre-tokenizer must be ByteLevel, or a Sequence ending in one.");
  for (const auto& [where, item] : items) {
    const std::string type = r.type(*item, where);
    const bool last = item == items.back().second;
    if (type == "ByteLevel" && last) {
      const bool use_regex = r.flag(*item, "use_regex", true, where);
      impl.steps.push_back(
          {r.flag(*item, "add_prefix_space", true, where), use_regex ? SplitPattern::gpt2 : SplitPattern::none});
    } else {
      r.unsupported(type == "Split", where + ".type", type,
                    "Supported: ByteLevel (last), Split with the GPT-2 or Llama 3 regex, Sequence of those.");
      impl.steps.push_back(read_split(r, *item, where));
    }
  }
}

void read_normalizer_and_decoder(const Reader& r, const json& root) {
  const json& normalizer = root.value("normalizer", json());
  const bool no_normalizer = normalizer.is_null() || (normalizer.value("type", "") == "Sequence" &&
                                                      normalizer.value("normalizers", json::array()).empty());
  r.unsupported(no_normalizer, "normalizer", normalizer, "Byte-level BPE tokenizers have none (null).");
  const json& decoder = r.member(root, "", "decoder");
  r.unsupported(decoder.is_object() && decoder.value("type", "") == "ByteLevel", "decoder", decoder,
                "The decoder must be ByteLevel.");
  for (const char* key : {"truncation", "padding"}) {
    if (root.contains(key) && !root.at(key).is_null()) {
      log::warn("[{}] {}: \"{}\" is set and ignored: titan never truncates or pads in encode().", kWhere, r.source(),
                key);
    }
  }
}

// The ids a post-processor puts before and after the text of a single sequence.
void read_post_processor(const Reader& r, const json& pp, const std::string& where, BpeTokenizer::Impl& impl) {
  if (pp.is_null()) return;
  const std::string type = r.type(pp, where);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = r.member(pp, where, "processors");
    r.check(list.is_array(), where + ".processors", "an array", list);
    for (size_t i = 0; i < list.size(); ++i) {
      read_post_processor(r, list[i], fmt::format("{}.processors[{}]", where, i), impl);
    }
    return;
  }
  auto token_id = [&](const json& pair, const char* key) {
    const std::string k = fmt::format("{}.{}", where, key);
    r.check(pair.is_array() && pair.size() == 2 && pair[1].is_number_integer(), k, "[token, id]", pair);
    return pair[1].get<int32_t>();
  };
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    impl.template_prefix.push_back(token_id(r.member(pp, where, "cls"), "cls"));
    impl.template_suffix.insert(impl.template_suffix.begin(), token_id(r.member(pp, where, "sep"), "sep"));
    return;
  }
  r.unsupported(type == "TemplateProcessing", where + ".type", type,
                "Supported post-processors: ByteLevel, TemplateProcessing, RobertaProcessing, BertProcessing, "
                "Sequence of those.");
  const json& single = r.member(pp, where, "single");
  const json& specials = r.member(pp, where, "special_tokens");
  r.check(single.is_array(), where + ".single", "an array", single);
  bool after_text = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& item = single[i];
    const std::string key = fmt::format("{}.single[{}]", where, i);
    if (item.is_object() && item.contains("Sequence")) {
      after_text = true;
      continue;
    }
    r.check(item.is_object() && item.contains("SpecialToken"), key, "{\"Sequence\": ...} or {\"SpecialToken\": ...}",
            item);
    const std::string name =
        r.string(r.member(item.at("SpecialToken"), key + ".SpecialToken", "id"), key + ".SpecialToken.id");
    const json& ids = r.member(r.member(specials, where + ".special_tokens", name.c_str()),
                               fmt::format("{}.special_tokens.{}", where, name), "ids");
    r.check(ids.is_array(), fmt::format("{}.special_tokens.{}.ids", where, name), "an array of ids", ids);
    auto& dst = after_text ? impl.template_suffix : impl.template_prefix;
    for (const json& id : ids) {
      r.check(id.is_number_integer(), fmt::format("{}.special_tokens.{}.ids", where, name), "token ids", ids);
      dst.push_back(id.get<int32_t>());
    }
  }
}

detail::AddedToken added_token(const Reader& r, const json& t, const std::string& where, bool special_default,
                               bool normalized_default) {
  detail::AddedToken token;
  token.content = r.string(r.member(t, where, "content"), where + ".content");
  token.special = r.flag(t, "special", special_default, where);
  token.normalized = r.flag(t, "normalized", normalized_default, where);
  token.lstrip = r.flag(t, "lstrip", false, where);
  token.rstrip = r.flag(t, "rstrip", false, where);
  token.single_word = r.flag(t, "single_word", false, where);
  return token;
}

void read_added_tokens(const Reader& r, const json& root, BpeTokenizer::Impl& impl) {
  const json& list = root.value("added_tokens", json::array());
  r.check(list.is_array(), "added_tokens", "an array", list);
  std::vector<detail::AddedToken> tokens;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = fmt::format("added_tokens[{}]", i);
    tokens.push_back(added_token(r, list[i], where, false, true));
  }
  impl.add_tokens(tokens);
  for (size_t i = 0; i < list.size(); ++i) {
    const auto declared = list[i].value("id", int64_t(-1));
    if (declared != impl.added_ids.at(tokens[i].content)) {
      log::warn("[{}] {}: added_tokens[{}] {} declares id {} but gets id {} (as in HF tokenizers).", kWhere, r.source(),
                i, json(tokens[i].content).dump(), declared, impl.added_ids.at(tokens[i].content));
    }
  }
}

// tokenizer_config.json, read as torchtitan's HuggingFaceTokenizer reads it: the standard special
// tokens and added_tokens_decoder are registered as special tokens; BOS/EOS are named by it.
void read_config(const Reader& r, const json& config, BpeTokenizer::Impl& impl) {
  r.check(config.is_object(), "", "a JSON object", config);
  auto content = [&](const char* key) -> std::optional<std::string> {
    if (!config.contains(key) || config.at(key).is_null()) return std::nullopt;
    const json& v = config.at(key);
    if (v.is_object()) return r.string(r.member(v, key, "content"), fmt::format("{}.content", key));
    return r.string(v, key);
  };
  std::vector<detail::AddedToken> tokens;
  for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token"}) {
    if (auto c = content(key)) {
      const json& v = config.at(key);
      tokens.push_back(v.is_object() ? added_token(r, v, key, true, true)
                                     : detail::AddedToken{.content = *c, .special = true});
    }
  }
  const json& decoder = config.value("added_tokens_decoder", json::object());
  r.check(decoder.is_object(), "added_tokens_decoder", "an object {id: token}", decoder);
  for (const auto& [id, t] : decoder.items()) {
    if (t.is_object() && t.contains("content")) {
      tokens.push_back(added_token(r, t, "added_tokens_decoder." + id, true, true));
    }
  }
  impl.add_tokens(tokens);
  for (auto [key, dst] : {std::pair{"bos_token", &impl.bos}, std::pair{"eos_token", &impl.eos}}) {
    if (auto c = content(key)) {
      *dst = impl.find(*c);
      r.check(dst->has_value(), key, "a token of the vocabulary or added tokens", *c);
    }
  }
}

}  // namespace

std::shared_ptr<BpeTokenizer> BpeTokenizer::from_json(const json& tokenizer, std::string source, const json* config,
                                                      std::string config_source) {
  const Reader r(std::move(source));
  r.check(tokenizer.is_object(), "", "a JSON object", tokenizer, "Is this a Hugging Face tokenizer.json?");
  auto impl = std::make_unique<Impl>();
  impl->source = r.source();
  read_model(r, r.member(tokenizer, "", "model"), *impl);
  read_normalizer_and_decoder(r, tokenizer);
  read_pre_tokenizer(r, tokenizer, *impl);
  read_post_processor(r, tokenizer.value("post_processor", json()), "post_processor", *impl);
  read_added_tokens(r, tokenizer, *impl);
  if (config != nullptr) read_config(Reader(std::move(config_source)), *config, *impl);
  impl->finalize();
  for (auto [id, flag] :
       {std::pair{impl->bos, &impl->template_adds_bos}, std::pair{impl->eos, &impl->template_adds_eos}}) {
    auto has = [&](const std::vector<int32_t>& v) { return std::find(v.begin(), v.end(), *id) != v.end(); };
    *flag = id.has_value() && (has(impl->template_prefix) || has(impl->template_suffix));
  }
  return std::shared_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

std::shared_ptr<BpeTokenizer> BpeTokenizer::from_files(const std::filesystem::path& tokenizer_json,
                                                       const std::filesystem::path& tokenizer_config) {
  const json tokenizer = detail::read_json_file(tokenizer_json, kWhere);
  if (tokenizer_config.empty()) return from_json(tokenizer, tokenizer_json.string());
  const json config = detail::read_json_file(tokenizer_config, kWhere);
  return from_json(tokenizer, tokenizer_json.string(), &config, tokenizer_config.string());
}

}  // namespace titan::data
