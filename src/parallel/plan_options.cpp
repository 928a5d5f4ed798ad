// SPDX-License-Identifier: BSD-3-Clause
// The planner's options as a job config states them: the one place that reads the job's sections for a plan.
#include "titan/core/config.hpp"
#include "titan/float8/converter.hpp"
#include "titan/parallel/planner.hpp"

namespace titan::parallel {

PlanOptions plan_options(const JobConfig& config, const torch::nn::Module& model, bool cuda) {
  PlanOptions options{.parallelism = config.parallelism, .activation_checkpoint = config.activation_checkpoint};
  // FSDP's mixed precision (bf16 gathers and compute, fp32 reduction): by default on GPU; on CPU when
  // training.mixed_precision_param says bfloat16. Without data parallelism the trainer autocasts instead.
  options.precision.param_dtype = scalar_type(mixed_precision_param(config.training, cuda));
  options.precision.reduce_dtype = scalar_type(config.training.mixed_precision_reduce);
  // torchao's float8 all-gather: the weights of the float8 Linears the converter made (run before this).
  if (config.float8.enable_fsdp_float8_all_gather) {
    options.precision.float8_all_gather = float8::fsdp_float8_weights(model);
    options.precision.float8_precompute_scales = config.float8.precompute_float8_dynamic_scale_for_fsdp;
  }
  return options;
}

}  // namespace titan::parallel
