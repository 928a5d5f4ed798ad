// SPDX-License-Identifier: BSD-3-Clause
// AdamW (and Adam) over a list of (local) parameter tensors, configured by the [optimizer] section
// (core/config.hpp: OptimizerConfig, torchtitan's defaults). Three implementations with identical math:
// fused (at::_fused_adamw_ / _fused_adam_, one kernel for all tensors), foreach (ATen _foreach_* ops)
// and for-loop (plain per-tensor ops; the reference twin). A fourth, fused_opt_states_bf16, keeps
// exp_avg and exp_avg_sq in bf16 over fp32 parameters and gradients (optim/detail/adam_bf16_states.hpp:
// a fused CPU kernel per parameter, the for-loop math elsewhere). Checkpointed through
// optim/optimizer.hpp.
//
// Parameter groups, by name: the first group whose pattern a parameter's name matches sets its weight decay and lr
// scale (torchtitan's optimizer.param_groups, first match wins); optimizer.exclude_from_weight_decay adds one group
// with no decay per pattern after them. Groups change only the update: the state stays one entry per parameter, so
// checkpoints save, load and reshard by parameter name as without them.
//
//   titan::AdamW optimizer(model.parameters(), config.optimizer, model.parameter_names(),
//                          {{.pattern = "^head\\.", .lr_scale = 0.1}});
#pragma once

#include "titan/core/config.hpp"
#include "titan/optim/optimizer.hpp"

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

namespace titan {

/// What the parameters whose names match `pattern` change from the optimizer's settings.
struct ParamGroup {
  /// An ECMAScript regular expression searched in each parameter's name ("bias" matches "layers.0.wq.bias").
  std::string pattern{};
  /// Weight decay of the group's parameters (unset: optimizer.weight_decay).
  std::optional<double> weight_decay{};
  /// Multiplies the (scheduled) lr of a step for the group's parameters.
  double lr_scale = 1.0;
};

/// The groups optimizer.exclude_from_weight_decay asks for: one per pattern, weight decay 0, lr as the rest.
std::vector<ParamGroup> param_groups(const OptimizerConfig& config);

/// The settings a parameter steps with.
struct ParamSettings {
  double weight_decay = 0.0;
  double lr_scale = 1.0;
};

/// Each of `count` parameters' settings: those of the first group whose pattern its name (`names`, required when
/// there are groups) contains a match of, else {weight_decay, 1}. AdamW and Muon place their parameters so.
std::vector<ParamSettings> param_settings(size_t count, const std::vector<std::string>& names,
                                          const std::vector<ParamGroup>& groups, double weight_decay);

class AdamW final : public Optimizer {
 public:
  /// Uses config's name (AdamW: decoupled weight decay; Adam: L2 decay added to the gradient), lr,
  /// betas, eps, weight_decay and implementation. fused_opt_states_bf16 takes float32 parameters only
  /// (an error names optimizer.implementation and training.dtype otherwise). `names` (each parameter's FQN,
  /// RankModel::parameter_names) place the parameters in `groups`, then in param_groups(config); they are required
  /// when there are groups.
  AdamW(std::vector<at::Tensor> params, const OptimizerConfig& config, const std::vector<std::string>& names = {},
        const std::vector<ParamGroup>& groups = {});

  void step(double lr) override;
  const std::vector<at::Tensor>& params() const override { return params_; }
  /// exp_avg and exp_avg_sq (like the parameter; bf16 under fused_opt_states_bf16), step (a () float32
  /// counter).
  std::vector<ParamState> state(size_t i) const override;

  const OptimizerConfig& config() const { return config_; }
  /// The weight decay and lr scale params()[i] steps with (its group's, else the config's).
  const ParamSettings& settings(size_t i) const { return settings_.at(i); }

 private:
  void step_fused(double lr, double weight_decay, const std::vector<size_t>& active);
  void step_foreach(double lr, double weight_decay, const std::vector<size_t>& active);
  void step_for_loop(double lr, const std::vector<size_t>& active);
  void step_bf16_states(double lr, const std::vector<size_t>& active);
  /// `active` split into runs of parameters with equal settings (a multi-tensor kernel call each).
  std::vector<std::vector<size_t>> same_settings(const std::vector<size_t>& active) const;

  std::vector<at::Tensor> params_;
  OptimizerConfig config_;
  std::vector<ParamSettings> settings_;  // per parameter
  std::vector<at::Tensor> exp_avgs_;     // each like its param (bf16 under fused_opt_states_bf16)
  std::vector<at::Tensor> exp_avg_sqs_;  // each like its param (bf16 under fused_opt_states_bf16)
  std::vector<at::Tensor> steps_;        // each () float32, the fused kernel's step counter
};

}  // namespace titan
