// SPDX-License-Identifier: BSD-3-Clause
// Private: what a rank's pipeline runtime holds between steps.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "titan/dist/process_group.hpp"
#include "titan/parallel/pipeline.hpp"

namespace titan::parallel::detail {

/// Shape and dtype of the tensors crossing one stage boundary (agreed on the first microbatch).
struct BoundaryMeta {
  std::vector<int64_t> sizes{};
  at::ScalarType dtype = at::kFloat;
};

struct PipelineState {
  PipelinePlan plan{};
  dist::ProcessGroup group;                             // the pp axis
  std::vector<int64_t> stage_rank{};                    // global stage -> pp rank
  std::vector<int64_t> local{};                         // this rank's stages, ascending
  std::map<int64_t, std::vector<at::Tensor>> params{};  // local stage -> its parameters (weight-gradient inputs)
  std::map<int64_t, PipelineProgram> programs{};        // microbatches -> validated program
  // A boundary's shapes depend on the microbatch's token shape (training and validation batches may
  // differ), which every pp rank knows: they are agreed once per (stage, microbatch rows, tokens).
  using BoundaryKey = std::tuple<int64_t, int64_t, int64_t>;  // (receiving stage, rows, tokens per row)
  std::map<BoundaryKey, BoundaryMeta> input_meta{};           // what the stage's input looks like
  std::set<BoundaryKey> meta_sent{};                          // the stage's input shape was sent to it
  at::Device device = at::kCPU;      // where the last step ran (collectives' tensors live there)
  std::function<void()> step_end{};  // after the step's last backward (may be empty)
  // Overlapped pairs run concurrently: plan.overlap_f_b, and no stage issues collectives (every other
  // mesh axis of size 1), since two threads' collectives on one group could be issued in different
  // orders on different ranks.
  bool overlap_f_b = false;
  PipelineTimeline timeline{};
  PipelineStats stats{};

  int64_t rank() const { return group.rank(); }
  int64_t num_stages() const { return static_cast<int64_t>(stage_rank.size()); }
  bool is_local(int64_t stage) const { return stage_rank[static_cast<size_t>(stage)] == rank(); }
};

/// The program of a schedule for this plan (CSV or generated), checked against the placement.
PipelineProgram build_program(const PipelineState& state, int64_t microbatches);
/// The forward-only program of a validation pass: microbatch by microbatch, stages ascending.
PipelineProgram forward_only_program(const PipelineState& state, int64_t microbatches);

}  // namespace titan::parallel::detail
