// SPDX-License-Identifier: BSD-3-Clause
// Activation checkpointing: a module's forward runs without keeping its intermediate activations
// (only its input is kept), and backward runs the forward again, with gradients, before going back
// through it. Memory per checkpointed block drops to its input; compute grows by one forward.
//
// parallelize() marks the modules plan.activation_checkpoint names; a model's forward lets the mark
// take effect by running the module through checkpoint_call (titan's Llama 3 blocks do):
//
//   at::Tensor Block::forward(const at::Tensor& x) const {
//     return titan::parallel::checkpoint_call(*this, x, [this](const at::Tensor& in) { return mlp->forward(in); });
//   }
//
// The recompute sees what the forward saw: the same RNG state (preserve_rng_state), the arguments the
// closure captured (the attention context among them), CPU and CUDA autocast as they were. It
// gathers FSDP units and runs TP collectives again, as the forward did. Under a pipeline schedule
// that splits backward into input and weight passes (zero-bubble), the recompute runs once, in the
// input pass, and its ops leave their weight gradients (with the inputs they need) to the weight pass
// (nn/split_backward.hpp). A backward restricted to some inputs (autograd::grad) is refused: the
// recompute would run once per pass.
//
// Per operator (options.per_op, torchtitan's selective "op" mode): the forward also keeps the outputs
// of the module's expensive ops — every other matmul and attention, see nn/saved_ops.hpp — and the
// recompute takes them back instead of running those ops again; only the rest is recomputed.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch::nn {
class Module;
}
namespace titan::nn {
struct SavedOpPolicy;
}

namespace titan::parallel {

/// A module forward that can run again in backward: owns what it captures.
using Recomputable = std::function<at::Tensor(const at::Tensor&)>;

/// How a checkpoint recomputes.
struct CheckpointOptions {
  /// Replay the forward's RNG state in the recompute (dropout draws the same mask).
  bool preserve_rng_state = true;
  /// Per operator: the forward keeps the op outputs this policy names; null: only the input is kept.
  std::shared_ptr<const nn::SavedOpPolicy> per_op{};
};

/// fn(x) as `module`'s forward: checkpointed when parallelize() marked the module, else as
/// module_call (with the module's tensor-parallel style, if any).
at::Tensor checkpoint_call(const torch::nn::Module& module, const at::Tensor& x, Recomputable fn);

/// fn(x) checkpointed, whatever the plan (under no-grad: plain fn(x)).
at::Tensor checkpoint(const at::Tensor& x, Recomputable fn, const CheckpointOptions& options = {});

namespace detail {
/// Marks `module` (at `path`, for errors; held by a std::shared_ptr) for checkpointing; returns the mark, which the
/// handle keeps and clears with unmark_checkpointed (only while it is still the module's mark).
std::shared_ptr<const CheckpointOptions> mark_checkpointed(const torch::nn::Module& module, const std::string& path,
                                                           CheckpointOptions options);
void unmark_checkpointed(const torch::nn::Module* module, const CheckpointOptions* mark);
}  // namespace detail

}  // namespace titan::parallel
