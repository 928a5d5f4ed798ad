// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/step.hpp"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <chrono>
#include <cstdlib>
#include <utility>

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/core/profile_scope.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/nn/loss.hpp"
#include "titan/optim/clip.hpp"
#include "titan/optim/optimizer.hpp"
#include "titan/parallel/context_parallel.hpp"
#include "titan/parallel/parallelize.hpp"

namespace titan {
namespace {

// Sum of `value` over the ranks of `axis`, in a buffer where the group's collectives want it (NCCL: the GPU).
double sum_over(const dist::Mesh& mesh, const char* axis, double value) {
  const dist::ProcessGroup& group = mesh.group(axis);
  if (group.size() == 1) return value;
  at::Tensor t = at::full({1}, value, at::TensorOptions().dtype(at::kDouble).device(group.device()));
  group.all_reduce(t).wait();
  return t.item<double>();
}

}  // namespace

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

StepBatch pull_microbatches(data::DataLoader& loader, const Parallelized& parallel, const dist::Mesh& mesh,
                            int64_t count) {
  TITAN_CHECK_VALUE(count >= 1, "[titan::pull_microbatches] expected at least 1 microbatch, got {}.", count);
  StepBatch out;
  out.microbatches.reserve(static_cast<size_t>(count));
  int64_t local_valid = 0;
  {
    const ProfileScope profile("titan::data_loading");
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < count; ++i) {
      data::Batch batch = loader.next();  // input, labels (B, S) int64
      out.tokens += batch.labels.numel();
      parallel::LocalBatch local = parallel.local_batch({.tokens = std::move(batch.input),
                                                         .labels = std::move(batch.labels),
                                                         .positions = std::move(batch.positions),
                                                         .document_ids = std::move(batch.document_ids)});
      local_valid += count_valid_tokens(local.labels);
      out.microbatches.push_back({std::move(local.tokens), std::move(local.labels), std::move(local.attention)});
    }
    out.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  // Every rank must divide by the same count, or the accumulated gradient is no longer the token mean.
  out.global_valid_tokens = static_cast<int64_t>(sum_over(mesh, "dp_cp", static_cast<double>(local_valid)));
  return out;
}

ForwardBackwardResult forward_backward(const Parallelized& parallel, const StepModel& model, const StepBatch& batch,
                                       const dist::Mesh& mesh, const at::Device& device, bool bf16_autocast) {
  const LossFn loss = [&parallel](const at::Tensor& logits, const at::Tensor& labels) {
    return parallel.cross_entropy_sum(logits, labels);  // logits (B, S, V), or (B, S, V/tp) under loss parallel
  };
  ForwardBackwardResult fb;
  if (parallel::Pipeline* pipeline = parallel.pipeline()) {
    TITAN_CHECK_VALUE(static_cast<bool>(model.stage_forward),
                      "[titan::forward_backward] expected StepModel::stage_forward under pipeline parallelism, got "
                      "none. Set it to run stage s of this rank's part of the model (e.g. forward_part).");
    TITAN_CHECK(batch.global_valid_tokens > 0,
                "[titan::forward_backward] expected valid label tokens in the global batch, got {}. Check the "
                "dataset (every label is -100), or fill StepBatch with pull_microbatches.",
                batch.global_valid_tokens);
    // Each stage's forward runs under autocast; the backward replays what it recorded.
    const parallel::StageForward stage_forward = [&](int64_t stage, const at::Tensor& x,
                                                     const nn::AttentionContext& context) {
      const AutocastScope scope(bf16_autocast, device.type());
      return parallel.run_forward([&] { return model.stage_forward(stage, x, context); });
    };
    // Each accumulation microbatch runs through the schedule in local_batch_size /
    // pipeline_parallel_microbatch_size pipeline microbatches.
    for (const Microbatch& mb : batch.microbatches) {
      fb.loss += pipeline->step(stage_forward, mb.input.to(device), mb.labels.to(device), loss,
                                1.0 / static_cast<double>(batch.global_valid_tokens), mb.attention);
      fb.valid_tokens += count_valid_tokens(mb.labels);
    }
  } else {
    TITAN_CHECK_VALUE(static_cast<bool>(model.forward),
                      "[titan::forward_backward] expected StepModel::forward, got none. Set it to the model's "
                      "forward(tokens, context).");
    // A layer that reads a sharded parameter around with_param fails in the first forward: the error names it.
    const ModelForward forward = [&](const at::Tensor& tokens, const nn::AttentionContext& context) {
      return parallel.run_forward([&] { return model.forward(tokens, context); });
    };
    fb = forward_backward(forward, batch.microbatches, device, batch.global_valid_tokens, bf16_autocast, loss);
  }
  fb.tokens = batch.tokens;
  fb.loss = sum_over(mesh, "dp_cp", fb.loss);  // each dp rank's slice, each cp rank's part of the sequences
  return fb;
}

double optimizer_step(Optimizer& optimizer, double lr, double max_norm, const dist::Mesh& mesh,
                      const std::vector<at::Tensor>& copies) {
  double norm = 0;
  {
    const ProfileScope profile("titan::clip_grad_norm");
    norm = clip_grad_norm_(optimizer.params(), max_norm, &mesh, copies);
  }
  const ProfileScope profile("titan::optimizer_step");
  optimizer.step(lr);
  return norm;
}

}  // namespace titan
