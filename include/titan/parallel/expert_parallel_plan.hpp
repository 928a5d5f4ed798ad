// SPDX-License-Identifier: BSD-3-Clause
// The expert-parallel part of a ParallelPlan alone: parallel/plan.hpp holds it by value, and every model
// includes the plan, so ExpertParallel's machinery stays out of the models' rebuilds.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace titan::parallel {

/// Expert parallelism over the mesh's ep axis: the model's MoE layers by module path.
struct ExpertParallelPlan {
  /// Module paths of the MoE layers (each an nn::MoE), e.g. {"layers.1.moe", "layers.2.moe"}.
  std::vector<std::string> moe_modules{};
  /// dtype the sharded experts compute in (FSDP's param_dtype, which casts the other weights);
  /// Undefined: as stored.
  at::ScalarType compute_dtype = at::ScalarType::Undefined;
};

}  // namespace titan::parallel
