// SPDX-License-Identifier: BSD-3-Clause
// DocumentStream: weighted mixture with a counter-based RNG, looping and one-pass (see document_stream.hpp).
#include "document_stream.hpp"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"

namespace titan::data::detail {
namespace {

// splitmix64: a counter-based generator, so the RNG state is one integer (the draw count).
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

void advance(StreamState& state, const StreamPosition& position) {
  state.draws = position.draws;
  state.cursors[size_t(position.source)] = position.cursor;
}

DocumentStream::DocumentStream(std::vector<WeightedSource> sources, uint64_t seed, bool loop)
    : sources_(std::move(sources)), seed_(seed), loop_(loop) {
  TITAN_CHECK_VALUE(!sources_.empty(), "[titan::data::DataLoader] expected at least one source, got none.");
  double total = 0;
  for (const WeightedSource& s : sources_) {
    TITAN_CHECK_VALUE(s.source != nullptr && s.weight > 0,
                      "[titan::data::DataLoader] expected sources with weight "
                      "> 0, got {} with weight {}.",
                      s.source ? s.source->name() : "null", s.weight);
    total += s.weight;
    cumulative_.push_back(total);
  }
  for (double& c : cumulative_) c /= total;
}

size_t DocumentStream::draw() {
  const uint64_t bits = mix(seed_ ^ mix(uint64_t(draws_++)));
  const double u = double(bits >> 11) * 0x1.0p-53;  // uniform in [0, 1)
  size_t i = 0;
  while (i + 1 < cumulative_.size() && u >= cumulative_[i]) ++i;
  return i;
}

bool DocumentStream::next(StreamRecord& out) {
  const size_t i = sources_.size() == 1 ? 0 : draw();
  Source& source = *sources_[i].source;
  if (!source.next(out.record)) {
    if (!loop_) return false;
    const int64_t epoch = source.cursor().epoch + 1;
    log::info("dataset {}: pass {} done; re-looping", source.name(), epoch);
    source.seek({.epoch = epoch});
    // A whole pass with no record: looping would spin forever.
    TITAN_CHECK_VALUE(source.next(out.record),
                      "[titan::data::DataLoader] dataset \"{}\": expected documents, got "
                      "none in a whole pass.",
                      source.name());
  }
  out.source = int32_t(i);
  out.after = {.draws = draws_, .source = int32_t(i), .cursor = source.cursor()};
  return true;
}

void DocumentStream::restore(const StreamState& state) {
  draws_ = state.draws;
  for (size_t i = 0; i < sources_.size(); ++i) sources_[i].source->seek(state.cursors[i]);
}

StreamState DocumentStream::initial_state() const {
  return {.draws = 0, .cursors = std::vector<SourceCursor>(sources_.size())};
}

nlohmann::json to_json(const StreamState& state, const DocumentStream& stream) {
  nlohmann::json sources = nlohmann::json::array();
  for (size_t i = 0; i < stream.size(); ++i) {
    const SourceCursor& c = state.cursors[i];
    sources.push_back({{"dataset", stream.source(i).name()},
                       {"epoch", c.epoch},
                       {"file", c.file},
                       {"offset", c.offset},
                       {"line", c.line}});
  }
  return {{"draws", state.draws}, {"sources", std::move(sources)}};
}

StreamState stream_state_from_json(const nlohmann::json& j, const DocumentStream& stream) {
  const nlohmann::json& sources = j.at("sources");
  std::vector<std::string> saved, ours;
  for (const auto& s : sources) saved.push_back(s.at("dataset").get<std::string>());
  for (size_t i = 0; i < stream.size(); ++i) ours.push_back(stream.source(i).name());
  TITAN_CHECK_VALUE(saved == ours,
                    "[titan::data::DataLoader] expected a state saved for datasets [\"{}\"], got one "
                    "for [\"{}\"]. Resume with the datasets (and order) the checkpoint was trained on.",
                    fmt::join(ours, "\", \""), fmt::join(saved, "\", \""));
  StreamState state{.draws = j.at("draws").get<int64_t>(), .cursors = {}};
  for (const auto& s : sources) {
    state.cursors.push_back({.epoch = s.at("epoch").get<int64_t>(),
                             .file = s.at("file").get<int64_t>(),
                             .offset = s.at("offset").get<int64_t>(),
                             .line = s.at("line").get<int64_t>()});
  }
  return state;
}

}  // namespace titan::data::detail
