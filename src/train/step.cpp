// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/step.hpp"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <cstdlib>

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/core/profile_scope.hpp"
#include "titan/nn/loss.hpp"

namespace titan {

void use_deterministic_algorithms(const DebugConfig& debug) {
  if (!debug.deterministic) return;
  at::globalContext().setDeterministicAlgorithms(true, debug.deterministic_warn_only);
  // cuBLAS reads it once, at its first handle: a user's own value wins (overwrite = 0).
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
}

AutocastScope::AutocastScope(bool enabled, at::DeviceType device) : enabled_(enabled), device_(device) {
  if (!enabled_) return;
  was_enabled_ = at::autocast::is_autocast_enabled(device_);
  dtype_was_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_dtype(device_, at::kBFloat16);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!enabled_) return;
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, dtype_was_);
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

ForwardBackwardResult forward_backward(const ModelForward& forward, const std::vector<Microbatch>& microbatches,
                                       const at::Device& device, int64_t global_valid_tokens, bool bf16_autocast,
                                       const LossFn& loss_fn) {
  ForwardBackwardResult result;
  for (const auto& mb : microbatches) {
    result.valid_tokens += count_valid_tokens(mb.labels);
    result.tokens += mb.labels.numel();
  }
  const int64_t denom = global_valid_tokens > 0 ? global_valid_tokens : result.valid_tokens;
  TITAN_CHECK(denom > 0,
              "[titan::forward_backward] expected valid label tokens, got none in {} microbatches. "
              "Check the dataset (every label is -100).",
              microbatches.size());
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));  // ()
  for (const auto& mb : microbatches) {
    const at::Tensor input = mb.input.to(device, /*non_blocking=*/true);    // (B, S)
    const at::Tensor labels = mb.labels.to(device, /*non_blocking=*/true);  // (B, S)
    at::Tensor loss;                                                        // ()
    {
      const ProfileScope profile("titan::forward");
      const AutocastScope autocast(bf16_autocast, device.type());
      const at::Tensor logits = forward(input, mb.attention);  // (B, S, V), or (B, S, V/tp) under loss parallel
      loss = (loss_fn ? loss_fn(logits, labels) : cross_entropy_sum(logits, labels)) / static_cast<double>(denom);
    }
    {
      const ProfileScope profile("titan::backward");
      loss.backward();
    }
    loss_sum += loss.detach();
  }
  result.loss = loss_sum.item<double>();
  return result;
}

}  // namespace titan
