// SPDX-License-Identifier: BSD-3-Clause
// A model whose sharding hook is spelled right (HookModel<true>) or wrong (HookModel<false>, which
// declares sharding_spek): TrainableModel must accept the first and reject the second, by name.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/models/trainable_model.hpp"

namespace titan::test {

template <bool kSpelledRight>
struct HookModel : torch::nn::Module {
  struct Args {};
  static std::shared_ptr<HookModel> build(const Args&, const ModelBuild&) { return nullptr; }
  at::Tensor forward(const at::Tensor& tokens, const nn::AttentionContext& = {}) const { return tokens; }
  at::Tensor forward_part(const at::Tensor& x, const std::vector<std::string>&,
                          const nn::AttentionContext& = {}) const {
    return x;
  }
  void init_weights() {}
  std::vector<at::Tensor> unique_parameters() const { return {}; }
  int64_t vocab_size() const { return 0; }
  int64_t num_params() const { return 0; }
  int64_t num_flops_per_token(int64_t) const { return 0; }
  parallel::ShardingSpec sharding_spec() const requires kSpelledRight { return {}; }
  parallel::ShardingSpec sharding_spek() const requires(!kSpelledRight) { return {}; }
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const { return nullptr; }
};

}  // namespace titan::test
