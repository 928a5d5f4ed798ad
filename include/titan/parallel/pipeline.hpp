// SPDX-License-Identifier: BSD-3-Clause
// Pipeline parallelism: the plan's stages placed on the pp ranks, and the runtime that executes a
// schedule's program (parallel/pipeline_schedule.hpp) on them. Activations and their gradients move
// between stages by point-to-point send/recv on the pp group (Gloo on CPU, NCCL on GPU), posted
// asynchronously; shapes and dtypes are agreed once per stage boundary, on the first microbatch.
// The loss is computed on the last stage, scaled by the caller (e.g. 1 / global valid tokens), so a
// step's gradients equal the one-device step's. A split backward (zero-bubble 'I' then 'W') defers the
// layers' weight GEMMs inside the layers (nn/split_backward.hpp): 'I' is the whole backward without
// them, 'W' runs only them, and both work under activation checkpointing. DualPipeV's overlapped
// forward/backward pairs run at the same time, the backward on a second thread (PipelinePlan::
// overlap_f_b, bitwise the sequential result), where pp is the whole mesh; with other axes the stages'
// own collectives (TP, CP, FSDP, EP) could be issued in different orders by the two threads on different
// ranks, so the pairs run in turn.
//
//   auto modules = parallel::pipeline_modules(plan.pipeline, mesh);   // build only these
//   auto applied = titan::parallelize(*model, mesh, plan);
//   parallel::Pipeline& pp = *applied.pipeline();
//   auto stage = [&](int64_t s, const at::Tensor& x, const nn::AttentionContext& context) {
//     return model->forward_part(x, plan.pipeline.stages[s], context);
//   };
//   double loss = pp.step(stage, tokens, labels, loss_fn, 1.0 / global_valid_tokens, local.attention);
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "titan/nn/attention_context.hpp"
#include "titan/nn/loss.hpp"
#include "titan/parallel/pipeline_schedule.hpp"
#include "titan/parallel/plan.hpp"

namespace titan::dist {
class Mesh;
}
namespace torch::nn {
class Module;
}

namespace titan::parallel {

namespace detail {
struct PipelineState;
}

/// The global stage indices this pp rank runs, ascending.
std::vector<int64_t> pipeline_stages(const PipelinePlan& plan, const dist::Mesh& mesh);
/// The module paths of this rank's stages: what the rank builds (the rest of the model is never
/// allocated on it).
std::vector<std::string> pipeline_modules(const PipelinePlan& plan, const dist::Mesh& mesh);

/// One stage's forward: (global stage index, input, the microbatch's attention context) -> output.
/// Stage 0 receives the batch's tokens (B, S); the others the previous stage's output; the last stage
/// returns the logits.
using StageForward =
    std::function<at::Tensor(int64_t stage, const at::Tensor& input, const nn::AttentionContext& context)>;

/// Per-step statistics of this rank.
struct PipelineStats {
  /// Most microbatches whose activations this rank held at once (forward done, backward not).
  int64_t max_in_flight = 0;
  /// Bytes received from and sent to other stages this step.
  int64_t bytes_moved = 0;
  /// Seconds spent blocked waiting for a stage's input or output gradient.
  double wait_seconds = 0;
  /// Forward/backward pairs run at the same time (PipelinePlan::overlap_f_b).
  int64_t overlapped_pairs = 0;
};

/// The applied pipeline of one rank (owned by the titan::Parallelized handle).
class Pipeline {
 public:
  explicit Pipeline(std::unique_ptr<detail::PipelineState> state);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  /// "PP(pp=2, 1F1B, stages [0] of 2, microbatch size 1)".
  std::string describe() const;
  /// This rank's stages (global indices, ascending).
  const std::vector<int64_t>& stages() const;
  /// Whether this rank runs stage 0 (it reads the tokens) / the last stage (it computes the loss).
  bool has_first_stage() const;
  bool has_last_stage() const;
  /// The program each rank runs for a batch of `microbatches` microbatches (validated).
  const PipelineProgram& program(int64_t microbatches);

  /// Forward and backward of one batch (B, S) split into B / microbatch_size microbatches, run by
  /// the schedule. Gradients accumulate in the parameters. On the last stage each microbatch's
  /// loss is loss(logits, labels) * loss_scale. Returns the batch's scaled loss summed over the
  /// microbatches, the same on every pp rank. Every rank of the pp group calls it with the same batch.
  /// `context` describes the batch's tokens; each microbatch's forward gets its rows.
  double step(const StageForward& forward, const at::Tensor& tokens, const at::Tensor& labels, const LossFn& loss,
              double loss_scale, const nn::AttentionContext& context = {});
  /// Forward only (validation), microbatch by microbatch: the summed unscaled loss, on every pp rank.
  double evaluate(const StageForward& forward, const at::Tensor& tokens, const at::Tensor& labels, const LossFn& loss,
                  const nn::AttentionContext& context = {});

  /// Called once per step after the last backward (FSDP's deferred gradient reduction under PP).
  void set_step_end_hook(std::function<void()> hook);

  /// For a weight that the first and the last stage each hold a copy of (the embedding multi-token prediction reads
  /// on the last stage, as Megatron keeps a tied embedding): adds the other copy's gradient to `param`'s, this rank's
  /// copy (undefined on a rank holding neither stage), so both copies step alike. Under FSDP both copies are sharded
  /// alike, so the shards pair up. Where one rank holds both stages it holds one tensor: nothing moves. Every pp rank
  /// calls it, after the step's last backward.
  void sum_first_last_stage_grads(const at::Tensor& param) const;

  /// The compute actions of the last step with their measured start and end (seconds from the
  /// step's start), for comparing the real bubble with the schedule's ideal one.
  const PipelineTimeline& last_timeline() const;
  /// Every pp rank's last_timeline() (collective over the pp group; start and end from each rank's
  /// own step start, which the step's first collective aligns).
  PipelineTimeline gather_timeline() const;
  /// Statistics of the last step.
  const PipelineStats& last_stats() const;

 private:
  std::unique_ptr<detail::PipelineState> state_;
};

namespace detail {
/// Checks the pipeline section against the mesh and the (partial) model before anything changes:
/// stage count for the schedule, each stage's modules on this rank present, the others absent.
void validate_pipeline(const torch::nn::Module& model, const PipelinePlan& plan, const dist::Mesh& mesh);
/// The runtime over the mesh's pp group for this rank's stages and their parameters.
std::unique_ptr<Pipeline> apply_pipeline(torch::nn::Module& model, const PipelinePlan& plan, const dist::Mesh& mesh);
}  // namespace detail

}  // namespace titan::parallel
