// SPDX-License-Identifier: BSD-3-Clause
// Must NOT compile: a model whose plan hook is misspelled (paralel_plan). ctest builds this file and
// requires the build to fail with the compiler naming the missing `parallel_plan` requirement.
#include "titan/models/trainable_model.hpp"

struct Misspelled : torch::nn::Module {
  static std::shared_ptr<Misspelled> build(const titan::JobConfig&, int64_t, const at::Device&) { return nullptr; }
  at::Tensor forward(const at::Tensor& tokens) const { return tokens; }
  void init_weights() {}
  std::vector<at::Tensor> unique_parameters() const { return {}; }
  int64_t vocab_size() const { return 0; }
  int64_t num_params() const { return 0; }
  int64_t num_flops_per_token(int64_t) const { return 0; }
  titan::parallel::ParallelPlan paralel_plan(const titan::JobConfig&, const titan::dist::Mesh&) const { return {}; }
  std::shared_ptr<const titan::checkpoint::HfAdapter> hf_adapter() const { return nullptr; }
};

static_assert(titan::TrainableModel<Misspelled>, "Misspelled must satisfy TrainableModel");
