// SPDX-License-Identifier: BSD-3-Clause
// The harness of the planner-against-tracker tests: every rank of a CPU layout (ranks as threads over Gloo)
// measures its parts, and a planned figure is compared with a measured one as a ratio.
#pragma once

#include <chrono>
#include <mutex>
#include <vector>

#include <ATen/ATen.h>

#include "dist/rank_test_util.hpp"
#include "test_util.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/decoder.hpp"
#include "titan/models/qwen3/args.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/loss.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"

namespace titan::test {

/// Qwen3-MoE's routing and layout, shrunk: D 64, 3 blocks (block 0 dense), 4 heads of 16 over 2 KV heads, 8 experts
/// of 64 hidden, top 2.
inline qwen3::Qwen3Args small_qwen3_moe() {
  qwen3::Qwen3Args a = qwen3::flavor("debugmodel_moe");
  a.dim = 64;
  a.n_layers = 3;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.head_dim = 16;
  a.hidden_dim = 128;
  a.vocab_size = 256;
  a.moe_inter_dim = 64;
  a.moe.num_experts = 8;
  a.moe.top_k = 2;
  a.mlp_only_layers = {0};
  return a;
}

/// One rank of `model` (built on the CPU for this job): two training steps under the tracker (zero_grad, forward +
/// loss + backward under the activations scope, AdamW), the second step's parts as the trainer reports them.
inline MemoryParts measure_rank(models::Decoder& model, const dist::Mesh& mesh, const JobConfig& config) {
  const Parallelized applied = parallelize(
      model, mesh, parallel::plan(model.sharding_spec(), parallel::plan_options(config, model, false), mesh.shape()));
  at::manual_seed(1);
  nn::manual_init_seed(1);
  model.init_weights();
  std::vector<at::Tensor> params = model.unique_parameters();
  for (auto& p : params) p.requires_grad_(true);
  AdamW optimizer(params, config.optimizer);
  MemoryTracker tracker;
  book_gradients_on_accumulation(params);
  // Tokens alike on the tp ranks (they share a batch), different over dp.
  at::manual_seed(100 + mesh.coordinate("dp"));
  const int64_t b = config.training.local_batch_size, s = config.training.seq_len;
  const at::Tensor tokens = at::randint(model.vocab_size(), {b, s}, at::kLong);  // (B, S)
  const at::Tensor labels = at::randint(model.vocab_size(), {b, s}, at::kLong);  // (B, S)
  for (int step = 0; step < 2; ++step) {
    const TrackMemory track(tracker);
    optimizer.zero_grad();
    tracker.reset_peaks();
    {
      const MemoryScope scope(MemoryCategory::activations);
      at::Tensor loss;
      {
        const at::Tensor logits = model.forward(tokens);  // (B, S, V) or (B, S, V/tp)
        loss = applied.cross_entropy_sum(logits, labels) / static_cast<double>(b * s);
      }
      loss.backward();
    }
    optimizer.step(1e-3);
  }
  std::vector<at::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  return {.parameters = storage_bytes(params),
          .gradients = storage_bytes(grads),
          .optimizer = optimizer.state_bytes(),
          .activations = tracker.peak(MemoryCategory::activations),
          .communication = tracker.peak(MemoryCategory::communication)};
}

/// measure_rank(mesh) on every rank of `shape`, in rank order.
template <class MeasureRank>
std::vector<MemoryParts> measure_ranks(const dist::MeshShape& shape, const MeasureRank& measure_rank) {
  std::vector<MemoryParts> out(static_cast<size_t>(shape.world_size()));
  std::mutex mutex;
  dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(shape, rank, store, mesh_options(std::chrono::seconds(120)));
    const MemoryParts parts = measure_rank(mesh);
    const std::lock_guard lock(mutex);
    out[static_cast<size_t>(rank)] = parts;
  });
  return out;
}

/// planned / measured (1 when both are 0).
inline double ratio(int64_t planned, int64_t measured) {
  return measured == 0 ? (planned == 0 ? 1.0 : 0.0) : static_cast<double>(planned) / static_cast<double>(measured);
}

}  // namespace titan::test
