// SPDX-License-Identifier: BSD-3-Clause
#include "titan/parallel/activation_checkpoint.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/nn/module.h>

#include <atomic>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>

#include "../layout/attachments.hpp"
#include "titan/core/error.hpp"
#include "titan/layout/module_hooks.hpp"
#include "titan/nn/saved_ops.hpp"
#include "titan/nn/split_backward.hpp"

namespace titan::parallel {
namespace {

using torch::autograd::variable_list;

// Modules marked by parallelize(): the index every parallel attachment shares (layout/attachments.hpp).
std::atomic<int64_t> marked_modules{0};
using WeakModule = std::weak_ptr<const torch::nn::Module>;
detail::Attachments<torch::nn::Module, WeakModule, const CheckpointOptions>& marks() {
  static detail::Attachments<torch::nn::Module, WeakModule, const CheckpointOptions> index(marked_modules);
  return index;
}

// Autocast on one device type: on, and in which dtype.
struct AutocastState {
  bool enabled = false;
  at::ScalarType dtype = at::kBFloat16;

  static AutocastState of(at::DeviceType device) {
    return {.enabled = at::autocast::is_autocast_enabled(device), .dtype = at::autocast::get_autocast_dtype(device)};
  }
  void apply(at::DeviceType device) const {
    at::autocast::set_autocast_dtype(device, dtype);
    at::autocast::set_autocast_enabled(device, enabled);
  }
};

// The device types whose autocast a checkpointed forward may run under (mixed precision without FSDP).
constexpr at::DeviceType kAutocastDevices[] = {at::kCPU, at::kCUDA};

// What the forward ran under, re-established for the recompute.
struct ForwardState {
  std::optional<at::Tensor> cpu_rng{};  // the default CPU generator's state (preserve_rng_state)
  AutocastState autocast[2]{};          // per kAutocastDevices: single-device mixed precision
  // A split-backward pipeline's (stage, microbatch) queue: the recompute's ops defer their weight
  // gradients into it, so a zero-bubble 'I' pass recomputes once and its 'W' pass reads what it kept.
  std::shared_ptr<nn::WeightGradQueue> weight_grads{};

  static ForwardState capture(bool preserve_rng) {
    ForwardState s;
    s.weight_grads = nn::recording_weight_grads();
    for (size_t i = 0; i < std::size(kAutocastDevices); ++i) s.autocast[i] = AutocastState::of(kAutocastDevices[i]);
    if (preserve_rng) {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard lock(gen.mutex());
      s.cpu_rng = gen.get_state();
    }
    return s;
  }
};

// Restores the forward's state for its lifetime, then what was there before. The recompute runs in
// backward, outside the forward's autocast scope: like torch.utils.checkpoint it opens its own, and
// the outermost one clears autocast's cache of casted weights on exit (else the next step's forward
// would read casts of weights the optimizer has since changed).
class Replay {
 public:
  explicit Replay(const ForwardState& s) : weight_grads_(s.weight_grads) {
    if (s.cpu_rng) {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard lock(gen.mutex());
      saved_rng_ = gen.get_state();
      gen.set_state(*s.cpu_rng);
    }
    for (size_t i = 0; i < std::size(kAutocastDevices); ++i) {
      autocast_was_[i] = AutocastState::of(kAutocastDevices[i]);
      s.autocast[i].apply(kAutocastDevices[i]);
    }
    at::autocast::increment_nesting();
  }
  ~Replay() {
    for (size_t i = 0; i < std::size(kAutocastDevices); ++i) autocast_was_[i].apply(kAutocastDevices[i]);
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    if (saved_rng_) {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard lock(gen.mutex());
      gen.set_state(*saved_rng_);
    }
  }
  Replay(const Replay&) = delete;
  Replay& operator=(const Replay&) = delete;

 private:
  std::optional<at::Tensor> saved_rng_;
  AutocastState autocast_was_[2]{};
  nn::WeightGradScope weight_grads_;
};

struct CheckpointBackward : torch::autograd::Node {
  CheckpointBackward(Recomputable fn, at::Tensor input, bool input_requires_grad, ForwardState state,
                     std::shared_ptr<nn::SavedOps> kept)
      : fn_(std::move(fn)),
        input_(std::move(input)),
        input_requires_grad_(input_requires_grad),
        state_(std::move(state)),
        kept_(std::move(kept)) {}

  variable_list apply(variable_list&& grads) override {
    const auto* restricted = torch::autograd::get_current_graph_task_exec_info();
    TITAN_CHECK_NOT_IMPLEMENTED(restricted == nullptr || restricted->empty(),
                                "[titan::parallel::checkpoint] expected a full backward through a checkpointed "
                                "module, got a pass restricted to some inputs (autograd::grad), which would "
                                "recompute it once per pass. Run torch::autograd::backward over the whole graph "
                                "(a zero-bubble pipeline splits its backward inside the layers, "
                                "nn/split_backward.hpp, and needs no restricted pass).");
    TITAN_CHECK(fn_,
                "[titan::parallel::checkpoint] expected one backward per forward, got a second one (the "
                "recompute is released after the first). Do not retain the graph through checkpointed modules.");
    at::Tensor x = input_.detach().requires_grad_(input_requires_grad_);
    at::Tensor y;
    {
      const Replay replay(state_);
      const c10::AutoGradMode grad(true);
      std::optional<nn::SavedOpsScope> take_kept;
      if (kept_) take_kept.emplace(*kept_, nn::SavedOpsScope::Phase::replay);
      y = fn_(x);
    }
    if (y.requires_grad() && grads[0].defined()) torch::autograd::backward({y}, {grads[0]});
    release_variables();
    return {input_requires_grad_ ? x.grad() : at::Tensor()};
  }
  std::string name() const override { return "titan::CheckpointBackward"; }
  void release_variables() override {
    fn_ = nullptr;
    input_.reset();
    kept_.reset();
  }

 private:
  Recomputable fn_;
  at::Tensor input_;  // detached
  bool input_requires_grad_;
  ForwardState state_;
  std::shared_ptr<nn::SavedOps> kept_;  // per operator: the op outputs the forward kept; else null
};

}  // namespace

at::Tensor checkpoint(const at::Tensor& x, Recomputable fn, const CheckpointOptions& options) {
  if (!c10::GradMode::is_enabled()) return fn(x);
  ForwardState state = ForwardState::capture(options.preserve_rng_state);
  std::shared_ptr<nn::SavedOps> kept = options.per_op ? std::make_shared<nn::SavedOps>(options.per_op) : nullptr;
  at::Tensor y;
  {
    const at::NoGradGuard no_grad;
    std::optional<nn::SavedOpsScope> record;
    if (kept) record.emplace(*kept, nn::SavedOpsScope::Phase::record);
    y = fn(x);
  }
  auto node = std::shared_ptr<CheckpointBackward>(
      new CheckpointBackward(std::move(fn), x.detach(), x.requires_grad(), std::move(state), std::move(kept)),
      torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  // The output is a fresh tensor from the no-grad forward: give it this node as its history.
  torch::autograd::set_history(y, node);
  return y;
}

at::Tensor checkpoint_call(const torch::nn::Module& module, const at::Tensor& x, Recomputable fn) {
  const CheckpointOptions* options = marks().find(&module);
  if (options == nullptr) return module_call(module, x, fn);
  return checkpoint(
      x, [&module, fn = std::move(fn)](const at::Tensor& in) { return module_call(module, in, fn); }, *options);
}

std::shared_ptr<const CheckpointOptions> detail::mark_checkpointed(const torch::nn::Module& module,
                                                                   const std::string& path, CheckpointOptions options) {
  auto mark = std::make_shared<const CheckpointOptions>(std::move(options));
  marks().attach(&module, shared_owner(module, path), mark);
  return mark;
}

void detail::unmark_checkpointed(const torch::nn::Module* module, const CheckpointOptions* mark) {
  marks().detach(module, mark);
}

}  // namespace titan::parallel
