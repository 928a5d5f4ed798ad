// SPDX-License-Identifier: BSD-3-Clause
#include "titan/parallel/tensor_parallel.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include "../layout/binding.hpp"
#include "find_module.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/loss.hpp"
#include "titan/parallel/plan.hpp"
#include "tp_styles.hpp"

namespace titan::parallel {

void detail::validate_tensor_parallel(const torch::nn::Module& model, const TensorParallelPlan& plan, int64_t degree) {
  auto& root = const_cast<torch::nn::Module&>(model);  // only read
  std::vector<const c10::TensorImpl*> vocab_sharded;   // in plan order: what a tied head may compute on
  for (const auto& [path, style] : plan.styles) {
    detail::check_style(path, detail::find_module(root, path, "tensor_parallel"), style, degree, vocab_sharded);
  }
}

TensorParallel::TensorParallel(std::unique_ptr<detail::TensorParallelState> state) : state_(std::move(state)) {}
TensorParallel::~TensorParallel() = default;

std::string TensorParallel::describe() const {
  return fmt::format("TP({}={}{}{}{})", state_->ctx.axis, state_->ctx.group.size(),
                     state_->sequence_parallel ? ", sequence parallel" : "",
                     state_->loss_parallel ? ", loss parallel" : "",
                     state_->ctx.async ? fmt::format(", async x{}", state_->ctx.chunks) : "");
}
const TensorParallelPlan& TensorParallel::plan() const { return state_->plan; }
const detail::TensorParallelState& TensorParallel::state() const { return *state_; }
int64_t TensorParallel::degree() const { return state_->ctx.group.size(); }
bool TensorParallel::loss_parallel() const { return state_->loss_parallel; }
std::vector<TensorParallelEvent> TensorParallel::trace() const {
  return state_->ctx.trace ? *state_->ctx.trace : std::vector<TensorParallelEvent>{};
}
void TensorParallel::clear_trace() {
  if (state_->ctx.trace) state_->ctx.trace->clear();
}

at::Tensor TensorParallel::cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) const {
  if (!state_->loss_parallel) return titan::cross_entropy_sum(logits, labels);
  const dist::ProcessGroup& group = state_->ctx.group;
  return vocab_parallel_cross_entropy_sum(logits, labels, group, group.rank() * logits.size(-1));
}

std::unique_ptr<TensorParallel> detail::apply_tensor_parallel(torch::nn::Module& model, const dist::Mesh& mesh,
                                                              const TensorParallelPlan& plan) {
  const dist::ProcessGroup& group = mesh.group("tp");
  auto state = std::make_unique<detail::TensorParallelState>();
  state->plan = plan;
  state->ctx = {.axis = "tp",
                .group = group,
                .async = plan.async,
                .chunks = plan.async_chunks,
                .trace = plan.trace ? std::make_shared<std::vector<TensorParallelEvent>>() : nullptr};
  for (const auto& [path, style] : plan.styles) {
    torch::nn::Module& module = detail::find_module(model, path, "tensor_parallel");
    detail::AppliedStyle applied =
        detail::apply_style(path, module, style, state->ctx, detail::prepared_by_ancestor(plan, path));
    if (applied.hook) {
      state->hooks.push_back({.path = path, .module = &module, .hook = applied.hook});
      detail::set_module_hook(module, path, std::move(applied.hook));
    }
    state->params.insert(state->params.end(), applied.params.begin(), applied.params.end());
    if (applied.layer.second != nullptr) state->layers.push_back(applied.layer);
    state->loss_parallel = state->loss_parallel || applied.loss_parallel;
    state->sequence_parallel = state->sequence_parallel || std::holds_alternative<SequenceParallel>(style);
  }
  return std::unique_ptr<TensorParallel>(new TensorParallel(std::move(state)));
}

}  // namespace titan::parallel
