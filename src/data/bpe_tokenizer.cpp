// SPDX-License-Identifier: BSD-3-Clause
// BpeTokenizer's encode/decode pipeline, in HF's order: added tokens are cut out first, the rest is
// pre-tokenized (prefix space, regex split, byte mapping) and merged piece by piece, then the
// post-processor's template and the requested BOS/EOS are put around it.
#include "titan/data/bpe_tokenizer.hpp"

#include <algorithm>

#include "bpe_tokenizer_impl.hpp"
#include "unicode.hpp"

namespace titan::data {
namespace {

void pre_tokenize(const BpeTokenizer::Impl& impl, std::string_view text, size_t step, std::vector<int32_t>& out) {
  if (step == impl.steps.size()) {
    impl.model->encode_piece(text, out);
    return;
  }
  const PreTokenizerStep& s = impl.steps[step];
  std::string prefixed;
  if (s.add_prefix_space && !text.starts_with(' ')) {
    prefixed.reserve(text.size() + 1);
    prefixed.append(" ").append(text);
    text = prefixed;
  }
  std::vector<std::string_view> pieces;
  split_pieces(text, s.split, pieces);
  for (std::string_view piece : pieces) pre_tokenize(impl, piece, step + 1, out);
}

}  // namespace

std::optional<int32_t> BpeTokenizer::Impl::find(std::string_view token) const {
  if (auto it = added_ids.find(token); it != added_ids.end()) return it->second;
  if (auto it = model->vocab().find(token); it != model->vocab().end()) return it->second;
  return std::nullopt;
}

void BpeTokenizer::Impl::add_tokens(const std::vector<detail::AddedToken>& tokens) {
  const auto model_size = int32_t(model->vocab().size());
  int32_t next_id = model_size;
  if (!added_by_id.empty()) {
    const int32_t max_added = added_by_id.rbegin()->first;
    next_id = max_added >= model_size ? max_added + 1 : model_size;
  }
  for (detail::AddedToken token : tokens) {
    if (token.content.empty()) continue;
    std::optional<int32_t> id = find(token.content);
    if (!id) id = next_id++;
    token.id = *id;
    added_ids.insert_or_assign(token.content, *id);
    if (token.special) special_contents.insert_or_assign(token.content, true);
    added_by_id.insert_or_assign(*id, std::move(token));
  }
}

void BpeTokenizer::Impl::finalize() {
  std::vector<detail::AddedToken> added;
  for (const auto& [id, token] : added_by_id) added.push_back(token);
  matcher = detail::AddedTokenMatcher(added);

  int32_t size = int32_t(model_tokens.size());
  if (!added_by_id.empty()) size = std::max(size, added_by_id.rbegin()->first + 1);
  decoded.assign(size_t(size), {});
  is_special.assign(size_t(size), false);
  for (int32_t id = 0; id < size; ++id) {
    const auto added_it = added_by_id.find(id);
    const std::string* token = nullptr;
    if (added_it != added_by_id.end()) {
      token = &added_it->second.content;
      is_special[id] = special_contents.contains(*token);
    } else if (size_t(id) < model_tokens.size()) {
      token = &model_tokens[id];
    }
    if (token == nullptr || token->empty()) continue;
    // HF's ByteLevel decoder: a token whose characters are all in the byte alphabet becomes those
    // bytes; any other token (e.g. a vocab entry spelled with a raw space) passes through as is.
    decoded[id] = from_byte_level(*token).value_or(*token);
  }
}

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::~BpeTokenizer() = default;

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  const Impl& impl = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_bos && impl.bos && !impl.template_adds_bos) ids.push_back(*impl.bos);
  ids.insert(ids.end(), impl.template_prefix.begin(), impl.template_prefix.end());
  std::vector<detail::TextPiece> segments;
  impl.matcher.split(text, segments);
  for (const detail::TextPiece& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
    } else {
      pre_tokenize(impl, seg.text, 0, ids);
    }
  }
  ids.insert(ids.end(), impl.template_suffix.begin(), impl.template_suffix.end());
  if (add_eos && impl.eos && !impl.template_adds_eos) ids.push_back(*impl.eos);
  return ids;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& impl = *impl_;
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= impl.decoded.size()) continue;
    if (skip_special_tokens && impl.is_special[id]) continue;
    bytes += impl.decoded[id];
  }
  return detail::utf8_lossy(bytes);
}

int64_t BpeTokenizer::vocab_size() const { return int64_t(impl_->decoded.size()); }
std::optional<int32_t> BpeTokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> BpeTokenizer::eos_id() const { return impl_->eos; }
bool BpeTokenizer::post_processor_adds_bos() const { return impl_->template_adds_bos; }
bool BpeTokenizer::post_processor_adds_eos() const { return impl_->template_adds_eos; }

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const { return impl_->find(token); }

std::optional<std::string> BpeTokenizer::id_to_token(int32_t id) const {
  if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) return it->second.content;
  if (id >= 0 && size_t(id) < impl_->model_tokens.size() && !impl_->model_tokens[id].empty()) {
    return impl_->model_tokens[id];
  }
  return std::nullopt;
}

}  // namespace titan::data
