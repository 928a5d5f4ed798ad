// SPDX-License-Identifier: BSD-3-Clause
// Forward + backward over gradient-accumulation microbatches with torchtitan's normalisation: every
// microbatch's summed cross-entropy is divided by the valid tokens of the WHOLE global batch, so the
// accumulated gradient is the exact token mean however the batch is split (and across dp ranks).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "titan/nn/attention_context.hpp"
#include "titan/nn/loss.hpp"

namespace titan {

struct DebugConfig;

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

}  // namespace titan
