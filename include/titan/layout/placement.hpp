// SPDX-License-Identifier: BSD-3-Clause
// Placement: how a tensor lies along one mesh axis (DTensor's Shard/Replicate/Partial). Its own header so
// that plans (parallel/plan.hpp, included by every model) name placements without pulling in ShardedParam.
#pragma once

#include <cstdint>
#include <string>

namespace titan::parallel {

/// How a tensor is laid out along one mesh axis.
struct Placement {
  enum class Kind { kReplicate, kShard, kPartial };
  Kind kind = Kind::kReplicate;  ///< replicated, sharded on `dim`, or a partial sum
  int64_t dim = 0;               ///< the sharded tensor dim (kShard only)

  static Placement replicate() { return {}; }
  static Placement shard(int64_t dim) { return {.kind = Kind::kShard, .dim = dim}; }
  static Placement partial() { return {.kind = Kind::kPartial, .dim = 0}; }
  /// "Shard(0)", "Replicate()", "Partial()"
  std::string str() const;
  bool operator==(const Placement&) const = default;
};

}  // namespace titan::parallel
