// SPDX-License-Identifier: BSD-3-Clause
// The planner's fitted constants. Everything else the plan computes is argued from the code it models
// (tensor sizes, collectives, the pipeline's program); these are read off torchtitan's published H100
// runs (pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md), each from the one row named at
// its field, the first row of the file that needs it. tests/planner/memory_plan_calibration_test.cpp
// refits every one from its row, checks the values here are that fit, and holds the plan to its bands
// only on the rows no constant saw (docs/memory_planner.md, "Calibration").
#pragma once

#include <cstdint>

#include "titan/planner/memory_plan.hpp"

namespace titan::planner::detail {

struct Calibration {
  /// Compute efficiency (hardware FLOPs, recompute included, over peak) of an eager bf16 step: fits Table 1's FSDP row.
  double eager_efficiency = 0.3795;
  /// torch.compile's factor on that efficiency: fits Table 1's FSDP + compile row.
  double compile_speedup = 1.1575;
  /// Float8 linears' factor on top: fits Table 1's FSDP + compile + Float8 row.
  double float8_speedup = 1.2808;
  /// Context parallelism's factor at degree 3-4 (attention in cp pieces and their merge): fits Table 2's CP 4 row.
  double cp4_efficiency = 0.6466;
  /// The same at degree 5 and above: fits Table 2's CP 8 row.
  double cp8_efficiency = 0.6026;
  /// The caching allocator's segments over a step's transient bytes, less one, without PP: fits Table 1's FSDP row.
  double transient_fragmentation = 0.0970;
  /// The same under PP, whose microbatches free their activations out of allocation order: fits Table 5's 1F1B row.
  double pipeline_fragmentation = 0.2710;

  /// The step's compute efficiency from these factors.
  double compute_efficiency(bool compiled, bool float8, int64_t cp) const {
    const double cp_factor = cp <= 2 ? 1.0 : cp <= 4 ? cp4_efficiency : cp8_efficiency;
    return eager_efficiency * (compiled ? compile_speedup : 1.0) * (float8 ? float8_speedup : 1.0) * cp_factor;
  }
};

/// planner.plan with `calibration` in place of the fitted constants: how the fit and its held-out test plan a row.
MemoryPlan plan_memory(MemoryPlanner& planner, const JobConfig& config, const PlanOptions& options,
                       const Calibration& calibration);

}  // namespace titan::planner::detail
