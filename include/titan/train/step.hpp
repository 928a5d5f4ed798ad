// SPDX-License-Identifier: BSD-3-Clause
// One training step as parts, the ones Trainer<Model> runs and a loop of your own calls:
//
//   titan::StepBatch batch = titan::pull_microbatches(*loader, parallel, mesh, grad_accum_steps);
//   optimizer.zero_grad();
//   titan::ForwardBackwardResult fb = titan::forward_backward(parallel, {.forward = ..., .stage_forward = ...},
//                                                           batch, mesh, device);
//   double grad_norm = titan::optimizer_step(optimizer, lr, config.training.max_norm, mesh);
//
// Forward + backward over gradient-accumulation microbatches with torchtitan's normalisation: every
// microbatch's summed cross-entropy is divided by the valid tokens of the WHOLE global batch, so the
// accumulated gradient is the exact token mean however the batch is split (and across dp ranks).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "titan/nn/attention_context.hpp"
#include "titan/nn/loss.hpp"
#include "titan/parallel/pipeline.hpp"

namespace titan {

struct DebugConfig;
class Optimizer;
class Parallelized;
namespace data {
class DataLoader;
}
namespace dist {
class Mesh;
}

/// debug.deterministic: ATen's deterministic algorithms (warn-only with debug.deterministic_warn_only) and
/// CUBLAS_WORKSPACE_CONFIG=:4096:8 unless the environment sets it (without it the first cuBLAS GEMM under
/// deterministic algorithms throws), as torchtitan's set_determinism does. Before any CUDA work; a no-op
/// when debug.deterministic is false.
void use_deterministic_algorithms(const DebugConfig& debug);

struct Microbatch {
  at::Tensor input;                  // (B, S) int64 (S/cp tokens per row under context parallelism)
  at::Tensor labels;                 // (B, S) int64, -100 = ignore
  nn::AttentionContext attention{};  // positions, documents, the cp split: passed to its forward
};

/// A model's forward: tokens (B, S) and their attention context -> logits (B, S, V).
using ModelForward = std::function<at::Tensor(const at::Tensor& tokens, const nn::AttentionContext& context)>;

struct ForwardBackwardResult {
  double loss = 0;           ///< sum over microbatches of CE_sum / global_valid_tokens
  int64_t valid_tokens = 0;  ///< labels != -100 across the microbatches
  int64_t tokens = 0;        ///< all label positions (torchtitan counts these for tps)
};

/// bf16 autocast on `device`'s type (CPU or CUDA) while alive, restored on exit (also when the forward
/// throws); a no-op when not `enabled`. As torch.autocast does, the outermost scope clears the cache of
/// casted weights on exit: the optimizer changes the weights before the next forward.
class AutocastScope {
 public:
  AutocastScope(bool enabled, at::DeviceType device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool enabled_;
  at::DeviceType device_;
  bool was_enabled_ = false;
  at::ScalarType dtype_was_ = at::kBFloat16;
};

/// Runs forward (with the microbatch's attention context) and backward on each microbatch (gradients accumulate in the
/// parameters' .grad). `global_valid_tokens` <= 0 means "count them here" (single data-parallel rank); `loss` (default
/// cross_entropy_sum) sums the token losses of one microbatch. `bf16_autocast` runs each forward (and
/// the loss) under bf16 autocast on `device`'s type, CPU or CUDA: mixed precision without FSDP.
ForwardBackwardResult forward_backward(const ModelForward& forward, const std::vector<Microbatch>& microbatches,
                                       const at::Device& device, int64_t global_valid_tokens = 0,
                                       bool bf16_autocast = false, const LossFn& loss = {});

/// One optimizer step's data as this rank sees it.
struct StepBatch {
  std::vector<Microbatch> microbatches{};  ///< this rank's part of each (its chunks of the sequences under CP)
  int64_t tokens = 0;                      ///< label positions this dp rank read, before the cp split (tps counts them)
  int64_t global_valid_tokens = 0;         ///< labels != -100 in the whole global batch (summed over dp x cp)
  double load_seconds = 0;                 ///< time spent reading the loader (the metrics' data-loading share)
};

/// Reads `count` gradient-accumulation microbatches from `loader` (this dp rank's slices), cuts each to this
/// rank's part with parallel.local_batch (under context parallelism its chunks of every sequence, with the
/// attention context its forward runs under) and counts the valid tokens of the whole global batch: one
/// all-reduce over mesh's dp_cp group, so every dp and cp rank calls it.
StepBatch pull_microbatches(data::DataLoader& loader, const Parallelized& parallel, const dist::Mesh& mesh,
                            int64_t count);

/// The model as a step runs it.
struct StepModel {
  ModelForward forward{};                  ///< the whole model: tokens and context -> logits (without a pipeline)
  parallel::StageForward stage_forward{};  ///< stage s of the pipeline: input and context -> output (under PP)
};

/// Forward and backward of a step's microbatches: under pipeline parallelism each microbatch through
/// parallel.pipeline()'s schedule with model.stage_forward, else model.forward as the overload above does. Each
/// microbatch's loss is parallel.cross_entropy_sum (vocab-sharded under loss parallel) over
/// batch.global_valid_tokens. The returned loss is summed over mesh's dp_cp group: the global batch's token mean,
/// the same on every rank (one all-reduce); tokens is batch.tokens. `bf16_autocast` runs every forward (or
/// stage forward) under bf16 autocast on `device`'s type.
ForwardBackwardResult forward_backward(const Parallelized& parallel, const StepModel& model, const StepBatch& batch,
                                       const dist::Mesh& mesh, const at::Device& device, bool bf16_autocast = false);

/// Clips the gradients of optimizer.params() to the global norm `max_norm` (the norm of the whole model, reduced
/// over the mesh axes each parameter is sharded on), then steps the optimizer with `lr`. Returns the norm before
/// clipping (the logged grad_norm). Every rank of the mesh calls it. `copies`: parameters the norm leaves out, as
/// clip_grad_norm_ does (a weight's second copy on another pipeline stage: mtp_embedding_copies).
double optimizer_step(Optimizer& optimizer, double lr, double max_norm, const dist::Mesh& mesh,
                      const std::vector<at::Tensor>& copies = {});

}  // namespace titan
