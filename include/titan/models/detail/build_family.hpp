// SPDX-License-Identifier: BSD-3-Clause
// A family's build from a job (torchtitan's update_from_config: seq_len from training), written once for every
// family's static build: model.name must be the family's, model.flavor gives the args, a vocab_size > 0 replaces
// theirs. Included by the families' model.cpp only (it brings in the job config).
#pragma once

#include <fmt/format.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"

namespace titan::models::detail {

/// Model(args, seq_len, options on device, modules) with args = flavor(config.model.flavor).
template <class Model, class Flavor>
std::shared_ptr<Model> build_family(std::string_view family, const Flavor& flavor, const JobConfig& config,
                                    int64_t vocab_size, const at::Device& device,
                                    const std::vector<std::string>& modules) {
  if (config.model.name != family) {
    throw ConfigError("model.name",
                      fmt::format("[titan::{}] expected model.name = '{}', got '{}'. Build a {} model with its own "
                                  "class, or any registered family with models::Decoder::build.",
                                  family, family, config.model.name, config.model.name));
  }
  auto args = flavor(config.model.flavor);
  if (vocab_size > 0) args.vocab_size = vocab_size;
  if (config.model.moe_load_balance_loss_weight != 0.0) {
    if constexpr (requires { args.moe.load_balance_loss_weight; }) {
      args.moe.load_balance_loss_weight = config.model.moe_load_balance_loss_weight;
    } else {
      throw ConfigError("model.moe_load_balance_loss_weight",
                        fmt::format("[titan::{}] expected model.moe_load_balance_loss_weight 0 for a family without "
                                    "MoE layers, got {}. Drop the key.",
                                    family, config.model.moe_load_balance_loss_weight));
    }
  }
  return std::make_shared<Model>(args, config.training.seq_len, at::TensorOptions().device(device), modules);
}

}  // namespace titan::models::detail
