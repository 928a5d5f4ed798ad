// SPDX-License-Identifier: BSD-3-Clause
// The metrics of a training run as torchtitan reports them, set up from the run: tokens/s per device (a batch is
// shared by the cp x tp x pp ranks that process it), TFLOPs and MFU against the peak of the dtype the GEMMs run in,
// memory, the console line with progress and ETA, metrics.jsonl on rank 0 and TensorBoard per metrics.*. A loop
// calls add_step every step and log on the steps metrics.log_freq names:
//
//   titan::MetricsProcessor metrics = titan::training_metrics(run, model.counts());
//   metrics.add_step(fb.tokens, batch.load_seconds);
//   if (titan::is_log_step(run.config(), step)) metrics.log(step, fb.loss, grad_norm, lr);
#pragma once

#include <cstdint>
#include <functional>

#include "titan/core/memory_tracker.hpp"
#include "titan/metrics/metrics.hpp"

namespace titan {

class RunContext;
struct ModelCounts;
struct JobConfig;

/// The run's MetricsProcessor for a model of `counts`; `memory_parts` (optional) is this rank's memory by part,
/// asked at each log. Logs the peak it measures MFU against.
MetricsProcessor training_metrics(const RunContext& run, const ModelCounts& counts,
                                  std::function<MemoryParts()> memory_parts = {});
/// Whether `step` is logged: the first, every metrics.log_freq-th and the last.
bool is_log_step(const JobConfig& config, int64_t step);

}  // namespace titan
