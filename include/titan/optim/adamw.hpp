// SPDX-License-Identifier: BSD-3-Clause
// AdamW over a list of (local) parameter tensors, torchtitan's defaults. Three implementations with
// identical math: "fused" (at::_fused_adamw_, one kernel for all tensors), "foreach" (ATen
// _foreach_* ops) and "for-loop" (plain per-tensor ops; the reference twin).
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace titan {

struct AdamWConfig {
  /// Peak learning rate (the LR schedule multiplies it).
  double lr = 8e-4;
  /// First-moment decay.
  double beta1 = 0.9;
  /// Second-moment decay.
  double beta2 = 0.95;
  /// Denominator epsilon.
  double eps = 1e-8;
  /// Decoupled weight decay, applied to every parameter (torchtitan: no exclusion groups).
  double weight_decay = 0.1;
  /// fused | foreach | for-loop.
  std::string implementation = "fused";
};

class AdamW {
 public:
  AdamW(std::vector<at::Tensor> params, AdamWConfig config);

  /// One update with learning rate `lr` (already scheduled). Parameters without a grad are skipped.
  void step(double lr);
  /// Drops gradients (sets them undefined, freeing memory; torch's set_to_none=True).
  void zero_grad();

  const AdamWConfig& config() const { return config_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  /// Optimizer state per parameter, aligned with params(): exp_avg, exp_avg_sq, step.
  const std::vector<at::Tensor>& exp_avgs() const { return exp_avgs_; }
  const std::vector<at::Tensor>& exp_avg_sqs() const { return exp_avg_sqs_; }
  const std::vector<at::Tensor>& steps() const { return steps_; }
  /// Bytes of optimizer state (for memory accounting).
  int64_t state_bytes() const;

 private:
  void step_fused(double lr, const std::vector<size_t>& active);
  void step_foreach(double lr, const std::vector<size_t>& active);
  void step_for_loop(double lr, const std::vector<size_t>& active);

  std::vector<at::Tensor> params_;
  AdamWConfig config_;
  std::vector<at::Tensor> exp_avgs_;     // each like its param
  std::vector<at::Tensor> exp_avg_sqs_;  // each like its param
  std::vector<at::Tensor> steps_;        // each () float32, the fused kernel's step counter
};

}  // namespace titan
