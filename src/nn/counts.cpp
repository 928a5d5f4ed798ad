// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/counts.hpp"

#include <torch/nn/module.h>

#include <unordered_set>

#include "titan/layout/sharded_param.hpp"

namespace titan::nn {

int64_t parameter_count(const torch::nn::Module& module) {
  std::unordered_set<const c10::TensorImpl*> seen;
  int64_t n = 0;
  for (const at::Tensor& p : module.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += parallel::global_numel(p);
  }
  return n;
}

int64_t training_flops_per_token(const TransformerFlops& f) {
  const int64_t v_head_dim = f.v_head_dim > 0 ? f.v_head_dim : f.head_dim;
  return 6 * f.matmul_params + 6 * f.layers * f.heads * (f.head_dim + v_head_dim) * f.seq_len;
}

}  // namespace titan::nn
