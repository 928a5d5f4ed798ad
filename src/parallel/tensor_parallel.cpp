// SPDX-License-Identifier: BSD-3-Clause
#include "titan/parallel/tensor_parallel.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include "../layout/binding.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/loss.hpp"
#include "tp_styles.hpp"

namespace titan::parallel {

namespace detail {
struct TensorParallelState {
  ParallelPlan plan;
  TpContext ctx;
  std::vector<const torch::nn::Module*> hooked;
  std::vector<at::Tensor> params;
  bool loss_parallel = false;
  bool sequence_parallel = false;

  ~TensorParallelState() {
    for (const auto* m : hooked) remove_module_hook(m);
    for (const auto& p : params) unbind_param(p);
  }
};
}  // namespace detail

namespace {

std::string kind_name(const ParallelStyle& style) {
  return std::visit(
      [](const auto& s) -> std::string {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, ColwiseParallel>) return "ColwiseParallel";
        if constexpr (std::is_same_v<S, RowwiseParallel>) return "RowwiseParallel";
        if constexpr (std::is_same_v<S, SequenceParallel>) return "SequenceParallel";
        return "PrepareModuleInput";
      },
      style);
}

// M: Module or const Module ("" names the root, which named_modules(include_self=false) omits).
template <class M>
M& find_module(M& model, const std::string& path) {
  if (path.empty()) return model;
  const auto modules = model.named_modules("", /*include_self=*/false);
  TITAN_CHECK_VALUE(modules.contains(path), "[titan::parallel::ParallelPlan] expected '{}' to name a submodule, got no "
                    "such module. Check the model's named_modules().", path);
  return *modules[path];
}

}  // namespace

std::string to_string(const ParallelStyle& style) {
  std::string args;
  if (const auto* s = std::get_if<ColwiseParallel>(&style)) {
    args = fmt::format("input={}, output={}{}", s->input_layout.str(), s->output_layout.str(),
                       s->loss_parallel ? ", loss_parallel" : "");
  } else if (const auto* r = std::get_if<RowwiseParallel>(&style)) {
    args = fmt::format("input={}, output={}", r->input_layout.str(), r->output_layout.str());
  } else if (const auto* p = std::get_if<PrepareModuleInput>(&style)) {
    args = fmt::format("input={}, desired={}", p->input_layout.str(), p->desired_input_layout.str());
  }
  return fmt::format("{}({})", kind_name(style), args);
}

std::string ParallelPlan::str() const {
  std::string out;
  for (const auto& [path, style] : entries) out += fmt::format("{}: {}\n", path.empty() ? "<root>" : path, to_string(style));
  return out;
}

void validate_plan(const torch::nn::Module& model, const ParallelPlan& plan, int64_t degree) {
  for (const auto& [path, style] : plan.entries) detail::check_style(path, find_module(model, path), style, degree);
}

TensorParallel::TensorParallel(std::unique_ptr<detail::TensorParallelState> state) : state_(std::move(state)) {}
TensorParallel::~TensorParallel() = default;

std::string TensorParallel::describe() const {
  return fmt::format("TP({}={}{}{}{})", state_->ctx.axis, state_->ctx.group.size(),
                     state_->sequence_parallel ? ", sequence parallel" : "", state_->loss_parallel ? ", loss parallel" : "",
                     state_->ctx.async ? fmt::format(", async x{}", state_->ctx.chunks) : "");
}
const ParallelPlan& TensorParallel::plan() const { return state_->plan; }
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

std::shared_ptr<TensorParallel> parallelize_module(torch::nn::Module& model, const dist::Mesh& mesh,
                                                   const ParallelPlan& plan, const TensorParallelOptions& options) {
  const dist::ProcessGroup& group = mesh.group(options.axis);
  if (group.size() == 1) return nullptr;
  validate_plan(model, plan, group.size());  // nothing is touched unless the whole plan fits
  auto state = std::make_unique<detail::TensorParallelState>();
  state->plan = plan;
  state->ctx = {.axis = options.axis,
                .group = group,
                .async = options.async,
                .chunks = options.async_chunks,
                .trace = options.trace ? std::make_shared<std::vector<TensorParallelEvent>>() : nullptr};
  for (const auto& [path, style] : plan.entries) {
    torch::nn::Module& module = find_module(model, path);
    detail::AppliedStyle applied = detail::apply_style(path, module, style, state->ctx);
    if (applied.hook) {
      detail::set_module_hook(&module, std::move(applied.hook));
      state->hooked.push_back(&module);
    }
    state->params.insert(state->params.end(), applied.params.begin(), applied.params.end());
    state->loss_parallel = state->loss_parallel || applied.loss_parallel;
    state->sequence_parallel = state->sequence_parallel || std::holds_alternative<SequenceParallel>(style);
  }
  return std::shared_ptr<TensorParallel>(new TensorParallel(std::move(state)));
}

}  // namespace titan::parallel
