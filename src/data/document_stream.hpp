// SPDX-License-Identifier: BSD-3-Clause
// Private to src/data: the global document stream, a deterministic weighted mixture of sources. Each
// record carries the stream position just after it, so whoever consumes records in order (the packer,
// behind worker threads that run ahead) can tell exactly where the stream stands at a batch boundary.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <vector>

#include "titan/data/dataloader.hpp"

namespace titan::data::detail {

/// Where the whole stream stands: mixture draws made and each source's cursor.
struct StreamState {
  int64_t draws = 0;                    // mixture RNG position (counter-based: draw i = hash(seed, i))
  std::vector<SourceCursor> cursors{};  // one per source, in the loader's order
};

/// The stream position right after one record: draws after it and the cursor of its source.
struct StreamPosition {
  int64_t draws = 0;
  int32_t source = 0;
  SourceCursor cursor{};
};

/// Moves `state` past the record whose position is `position`.
void advance(StreamState& state, const StreamPosition& position);

struct StreamRecord {
  Record record{};
  int32_t source = 0;
  StreamPosition after{};
};

class DocumentStream {
 public:
  DocumentStream(std::vector<WeightedSource> sources, uint64_t seed, bool loop);

  /// The next record; false when a one-pass stream has run out (the first source to end ends it).
  bool next(StreamRecord& out);
  void restore(const StreamState& state);
  StreamState initial_state() const;

  const Source& source(size_t i) const { return *sources_[i].source; }
  const std::shared_ptr<Source>& source_ptr(size_t i) const { return sources_[i].source; }
  size_t size() const { return sources_.size(); }

 private:
  size_t draw();

  std::vector<WeightedSource> sources_;
  std::vector<double> cumulative_;  // normalised cumulative weights
  uint64_t seed_;
  bool loop_;
  int64_t draws_ = 0;
};

nlohmann::json to_json(const StreamState& state, const DocumentStream& stream);
/// Checks the saved source names against `stream`'s; errors name both.
StreamState stream_state_from_json(const nlohmann::json& j, const DocumentStream& stream);

}  // namespace titan::data::detail
