// SPDX-License-Identifier: BSD-3-Clause
// AdamW (and Adam) over a list of (local) parameter tensors, configured by the [optimizer] section
// (core/config.hpp: OptimizerConfig, torchtitan's defaults). Three implementations with identical math:
// fused (at::_fused_adamw_ / _fused_adam_, one kernel for all tensors), foreach (ATen _foreach_* ops)
// and for-loop (plain per-tensor ops; the reference twin). A fourth, fused_opt_states_bf16, keeps
// exp_avg and exp_avg_sq in bf16 over fp32 parameters and gradients (optim/detail/adam_bf16_states.hpp:
// a fused CPU kernel per parameter, the for-loop math elsewhere). Checkpointed through
// optim/optimizer.hpp.
#pragma once

#include "titan/core/config.hpp"
#include "titan/optim/optimizer.hpp"

#include <ATen/core/Tensor.h>

#include <vector>

namespace titan {

class AdamW final : public Optimizer {
 public:
  /// Uses config's name (AdamW: decoupled weight decay; Adam: L2 decay added to the gradient), lr,
  /// betas, eps, weight_decay and implementation. fused_opt_states_bf16 takes float32 parameters only
  /// (an error names optimizer.implementation and training.dtype otherwise).
  AdamW(std::vector<at::Tensor> params, const OptimizerConfig& config);

  void step(double lr) override;
  const std::vector<at::Tensor>& params() const override { return params_; }
  /// exp_avg and exp_avg_sq (like the parameter; bf16 under fused_opt_states_bf16), step (a () float32
  /// counter).
  std::vector<ParamState> state(size_t i) const override;

  const OptimizerConfig& config() const { return config_; }

 private:
  void step_fused(double lr, const std::vector<size_t>& active);
  void step_foreach(double lr, const std::vector<size_t>& active);
  void step_for_loop(double lr, const std::vector<size_t>& active);
  void step_bf16_states(double lr, const std::vector<size_t>& active);

  std::vector<at::Tensor> params_;
  OptimizerConfig config_;
  std::vector<at::Tensor> exp_avgs_;     // each like its param (bf16 under fused_opt_states_bf16)
  std::vector<at::Tensor> exp_avg_sqs_;  // each like its param (bf16 under fused_opt_states_bf16)
  std::vector<at::Tensor> steps_;        // each () float32, the fused kernel's step counter
};

}  // namespace titan
