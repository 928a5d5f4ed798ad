// SPDX-License-Identifier: BSD-3-Clause
// Private: the hooks ProcessGroup and Mesh call into the process's flight recorder
// (src/dist/flight_recorder.cpp). Every hook is a cheap no-op while the recorder is off.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace titan::dist::detail {

/// The group facts an entry carries.
struct TracedGroup {
  const std::string& name;
  const std::vector<int64_t>& ranks;
};

/// True while the recorder is on.
bool recorder_enabled();
/// Before issuing: throws once the run was stopped; blocks and then throws for the collective the
/// test fault skip_collective skips (core/test_faults.hpp). Call only while the recorder is on.
void before_collective(const TracedGroup& group, const char* op);
/// Records a scheduled collective (input tensor: shape and dtype; undefined for barrier); returns its id.
int64_t record_collective(const TracedGroup& group, int64_t seq, const char* op, const at::Tensor& input);
/// Hands the backend's work to the watchdog, which times it.
void watch(int64_t id, const c10::intrusive_ptr<c10d::Work>& work);
/// A host thread waits on it / it completed.
void mark_started(int64_t id);
void mark_completed(int64_t id);
/// It failed (timeout, peer gone): dumps every rank's ring and returns the sentence to add to the error.
std::string mark_failed(int64_t id, const std::string& what);
/// The launch-environment store: the watchdog that fires sets a key every rank's watchdog polls.
void attach_store(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world_size);

}  // namespace titan::dist::detail
