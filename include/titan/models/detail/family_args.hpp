// SPDX-License-Identifier: BSD-3-Clause
// A family's arguments from the registry's DecoderArgs, written once for every bundled family: the flavor's
// arguments, then DecoderArgs' replacements (torchtitan's update_from_config: the longest sequence is the job's).
#pragma once

#include <fmt/format.h>

#include <string_view>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/models/decoder.hpp"

namespace titan::models::detail {

/// `flavor` with args' vocab_size, max_seq_len, MoE loss weight and multi-token prediction where they are set.
template <class Args>
Args family_args(Args flavor, const DecoderArgs& args, std::string_view family) {
  if (args.vocab_size > 0) flavor.vocab_size = args.vocab_size;
  if (args.max_seq_len > 0) {
    // torchtitan sizes the model to the job's sequence, warning when that is past the flavor's maximum.
    if (args.max_seq_len > flavor.max_seq_len) {
      log::warn(
          "[titan::{}] sequence length {} exceeds the flavor's maximum {} (max_seq_len); RoPE tables are "
          "sized to it",
          family, args.max_seq_len, flavor.max_seq_len);
    }
    flavor.max_seq_len = args.max_seq_len;
  }
  if (args.moe_load_balance_loss_weight != 0.0) {
    if constexpr (requires { flavor.moe.load_balance_loss_weight; }) {
      flavor.moe.load_balance_loss_weight = args.moe_load_balance_loss_weight;
    } else {
      throw ConfigError("model.moe_load_balance_loss_weight",
                        fmt::format("[titan::{}] expected model.moe_load_balance_loss_weight 0 for a family without "
                                    "MoE layers, got {}. Drop the key.",
                                    family, args.moe_load_balance_loss_weight));
    }
  }
  if (args.num_nextn_predict_layers != 0) {
    if constexpr (requires { flavor.num_nextn_predict_layers; }) {
      flavor.num_nextn_predict_layers = args.num_nextn_predict_layers;
      flavor.mtp_loss_scaling_factor = args.mtp_loss_scaling_factor;
    } else {
      throw ConfigError("model.num_nextn_predict_layers",
                        fmt::format("[titan::{}] expected model.num_nextn_predict_layers 0 for a family without "
                                    "multi-token prediction (deepseek_v3 has it), got {}. Drop the key.",
                                    family, args.num_nextn_predict_layers));
    }
  }
  return flavor;
}

/// The family's model from its arguments: Model(args, args.max_seq_len, where.device, where.modules).
template <class Model, class Args>
std::shared_ptr<Model> build_family(const Args& args, const ModelBuild& where) {
  return std::make_shared<Model>(args, args.max_seq_len, at::TensorOptions().device(where.device), where.modules);
}

}  // namespace titan::models::detail
