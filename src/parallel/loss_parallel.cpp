// SPDX-License-Identifier: BSD-3-Clause
// Cross-entropy on vocab-sharded logits (Megatron's vocab-parallel cross-entropy). With the global
// max m, the global sum of exponentials Z and the target logit t of each token:
//   loss = log Z + m - t,   d loss / d logit_j = softmax_j - [j == target]
// Each rank computes its columns of both; only (B*S)-sized vectors cross the network.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "titan/core/error.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/nn/loss.hpp"
#include "titan/parallel/tensor_parallel.hpp"

namespace titan::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& labels,
                            const dist::ProcessGroup* group, int64_t vocab_offset) {
    const at::Tensor local = logits.flatten(0, 1).to(at::kFloat);  // (N, V/tp) fp32, as the gathered loss computes
    const int64_t width = local.size(1);
    const at::Tensor target = labels.flatten();        // (N)
    const at::Tensor valid = target.ne(kIgnoreIndex);  // (N)
    at::Tensor column = target - vocab_offset;         // (N) target column in this shard
    const at::Tensor here = valid.logical_and(column.ge(0)).logical_and_(column.lt(width));  // (N)
    column.masked_fill_(here.logical_not(), 0);

    at::Tensor max = std::get<0>(local.max(1)).contiguous();  // (N)
    group->all_reduce(max, dist::ReduceOp::kMax).wait();
    // Sum of exponentials and target logit travel together: one all-reduce.
    at::Tensor sums = at::stack({(local - max.unsqueeze(1)).exp_().sum(1),
                                 local.gather(1, column.unsqueeze(1)).squeeze(1).masked_fill(here.logical_not(), 0.0)})
                          .contiguous();  // (2, N)
    group->all_reduce(sums).wait();
    const at::Tensor lse = sums[0].log() + max;                                           // (N)
    const at::Tensor loss = (lse - sums[1]).masked_fill(valid.logical_not(), 0.0).sum();  // ()

    ctx->save_for_backward({logits, lse, column, here, valid});
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];                                                 // (B, S, V/tp)
    const at::Tensor& lse = saved[1];                                                    // (N)
    const at::Tensor& column = saved[2];                                                 // (N)
    const at::Tensor& here = saved[3];                                                   // (N)
    const at::Tensor& valid = saved[4];                                                  // (N)
    at::Tensor grad = logits.flatten(0, 1).to(at::kFloat).sub(lse.unsqueeze(1)).exp_();  // (N, V/tp) softmax
    grad.scatter_add_(1, column.unsqueeze(1), here.to(at::kFloat).neg().unsqueeze(1));
    grad.mul_(valid.to(at::kFloat).unsqueeze(1) * grads[0]);
    return {grad.view(logits.sizes()).to(logits.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels,
                                            const dist::ProcessGroup& group, int64_t vocab_offset) {
  TITAN_CHECK_VALUE(
      logits.dim() == 3 && labels.dim() == 2 && logits.size(0) == labels.size(0) && logits.size(1) == labels.size(1),
      "[titan::parallel::vocab_parallel_cross_entropy_sum] expected logits (B, S, V/tp) and labels (B, S), "
      "got {} and {}.",
      c10::str(logits.sizes()), c10::str(labels.sizes()));
  return VocabParallelCrossEntropy::apply(logits, labels, &group, vocab_offset);
}

}  // namespace titan::parallel
