// SPDX-License-Identifier: BSD-3-Clause
// FSDP/HSDP/DDP's options alone: parallel/plan.hpp holds them by value, and every model includes the plan,
// so keeping DataParallel itself out of this header keeps its changes from rebuilding every model.
#pragma once

#include <c10/core/ScalarType.h>

#include "titan/core/choices.hpp"

#include <string>
#include <vector>

namespace titan::parallel {

/// How FSDP/HSDP/DDP issue their collectives.
enum class DataParallelCollectives {
  auto_,      ///< per_param on CPU, flat on GPU
  flat,       ///< one all-gather / reduce-scatter per unit over a packed buffer: fewest launches, one copy in, one out
  per_param,  ///< one collective per parameter, straight into its gathered storage and out of autograd's gradient
};
TITAN_CHOICES(DataParallelCollectives, {DataParallelCollectives::auto_, "auto"},
              {DataParallelCollectives::flat, "flat"}, {DataParallelCollectives::per_param, "per_param"})

/// FSDP/HSDP/DDP options (torchtitan's parallelism.fsdp_* and training.mixed_precision_*).
struct DataParallelOptions {
  /// always (free each unit after its forward, except the last unit, whose backward comes first),
  /// default (as always, but also keep the unit before the last, the last block: torchtitan before 0.2;
  /// torchtitan 0.2.2's apply_fsdp keeps only norm + output, which is `always`) or
  /// never (keep everything gathered from forward to backward).
  ReshardAfterForward reshard_after_forward = ReshardAfterForward::default_;
  /// dtype of the gathered parameters and of compute (bf16 on GPU; fp32 on CPU).
  at::ScalarType param_dtype = at::kFloat;
  /// dtype gradients are reduced in.
  at::ScalarType reduce_dtype = at::kFloat;
  /// See DataParallelCollectives.
  DataParallelCollectives collectives = DataParallelCollectives::auto_;
  /// Prefetch the next unit's all-gather and leave reduce-scatters in flight (false: every collective
  /// waits where it is issued, the no-overlap ablation of bench_step_throughput --overlap 0).
  bool overlap = true;
  /// Record the collective/compute event trace (tests and debugging).
  bool trace = false;
  /// FQNs of parameters FSDP all-gathers in float8 e4m3 with a tensorwise scale from the whole tensor (tensorwise
  /// float8 Linears' weights, float8::fsdp_float8_weights)
  std::vector<std::string> float8_all_gather{};
  /// With float8_all_gather: all their scales in one amax all-reduce per forward (at its first gather) instead of one
  /// per parameter per gather
  bool float8_precompute_scales = false;
  /// FQNs of parameters left out of every unit (FSDP2's ignored_params): neither sharded nor reduced here, e.g.
  /// expert-parallel experts, whose gradients ExpertParallel::reduce_expert_gradients sums
  std::vector<std::string> ignored_params{};
};

}  // namespace titan::parallel
