// SPDX-License-Identifier: BSD-3-Clause
// A named range in profiler traces: an at::RecordFunction user scope (what RECORD_USER_SCOPE opens), so
// titan's phases (FSDP all-gathers and reduce-scatters per unit, TP collectives, data loading, the
// optimizer step, checkpoint staging, forward and backward) show up in Kineto's Chrome traces beside the
// aten ops, and in titan's own per-thread recorder (metrics/profiler.hpp). With no profiler on, it costs
// one check and builds no name.
//
//   { titan::ProfileScope scope("FSDP::all_gather ", unit_name); ... }   // "FSDP::all_gather layers.0"
#pragma once

#include <memory>
#include <string_view>

namespace at {
class RecordFunction;
}

namespace titan {

/// Opens a user-scope range named `name` + `suffix` (concatenated) for its lifetime, when a profiler
/// listens; otherwise nothing. Begins and ends on the constructing thread (scopes nest).
class ProfileScope {
 public:
  explicit ProfileScope(std::string_view name, std::string_view suffix = {});
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  std::unique_ptr<at::RecordFunction> range_;
};

}  // namespace titan
