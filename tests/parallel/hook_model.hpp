// SPDX-License-Identifier: BSD-3-Clause
// A model spec whose plan hook is spelled right (HookModel<true>) or wrong (HookModel<false>, which
// declares paralel_plan): TrainableModel must accept the first and reject the second, by name.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/models/trainable_model.hpp"

namespace titan::test {

template <bool kSpelledRight>
struct HookModel : torch::nn::Module {
  static std::shared_ptr<HookModel> build(const JobConfig&, int64_t, const at::Device&,
                                          const std::vector<std::string>& = {}) {
    return nullptr;
  }
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
  parallel::ParallelPlan parallel_plan(const JobConfig&, const dist::Mesh&) const requires kSpelledRight { return {}; }
  parallel::ParallelPlan paralel_plan(const JobConfig&, const dist::Mesh&) const requires(!kSpelledRight) { return {}; }
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const { return nullptr; }
};

}  // namespace titan::test
