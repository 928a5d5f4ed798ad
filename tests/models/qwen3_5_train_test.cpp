// SPDX-License-Identifier: BSD-3-Clause
// Qwen3.5 under FSDP 2, TP 2 (every block's heads split, Gated DeltaNet's included), FSDP 2 x TP 2, and CP 2 and 4
// (the Gated DeltaNet state passed from cp rank to cp rank, contiguous shards) (ranks as
// threads on the strict backend: NCCL's rules over Gloo) trains as in one process: a
// small Qwen3.5 (three Gated DeltaNet blocks with grouped value heads and 8-token chunks, one gated full-attention
// block) planned from its sharding spec alone, 6 AdamW steps on 32-token sequences, every other step with two
// documents per row (the recurrence and the convolution restart, RoPE positions per document).
//
// Tolerance, 1e-5 relative on losses and grad norms, 1e-5 absolute and relative on every final weight, argued as in
// tests/parallel/user_model_parity_test.cpp: the layouts compute the same fp32 math with sums in another order
// (~1e-7 relative per reduction), and AdamW (lr 1e-3, eps 1e-6) moves an element whose gradient is at rounding level
// by at most lr * dg / eps < 1e-6 per step. A sharding error changes a gradient by its own size: the loss from that
// step, and the weights by up to lr per step.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "parallel/parity_check.hpp"
#include "test_util.hpp"
#include "titan/models/qwen3_5/model.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/rank_model.hpp"
#include "titan/train/step.hpp"

namespace qwen3_5_train_test {
namespace {

using namespace titan;

constexpr int64_t kSteps = 6;
constexpr double kLr = 1e-3;
const test::ParityRun kBatches{.global_batch = 4, .seq_len = 32};

qwen3_5::Qwen35Args small_args() {
  return {.dim = 64,
          .n_layers = 4,
          .n_heads = 4,
          .n_kv_heads = 2,
          .head_dim = 16,
          .vocab_size = 512,
          .hidden_dim = 128,
          .max_seq_len = 64,
          .linear = {.n_key_heads = 2, .n_value_heads = 4, .key_head_dim = 16, .value_head_dim = 16, .chunk_size = 8},
          .tie_word_embeddings = false};
}

test::NamedRun train_with(const dist::Mesh& mesh, AcMode checkpoint) {
  nn::manual_init_seed(11);
  const auto meta = qwen3_5::Qwen35::build(small_args(), {.device = at::kMeta});
  // Contiguous cp shards: the Gated DeltaNet blocks pass their state from each cp rank to the next.
  const parallel::ParallelPlan plan = parallel::plan(
      meta->sharding_spec(),
      {.parallelism = {.context_parallel_load_balancer = std::nullopt}, .activation_checkpoint = {.mode = checkpoint}},
      mesh.shape());
  const auto model = qwen3_5::Qwen35::build(small_args(), {.device = at::kCPU});
  const Parallelized parallel = parallelize(*model, mesh, plan);
  model->init_weights();
  const std::vector<at::Tensor> params = model->unique_parameters();
  const std::vector<std::string> names = parameter_names(*model, params);
  AdamW optimizer(params, {.lr = kLr, .eps = 1e-6, .weight_decay = 0.1}, names);
  const StepModel step_model{.forward = [&](const at::Tensor& tokens, const nn::AttentionContext& context) {
    return model->forward(tokens, context);
  }};
  const int64_t local = kBatches.global_batch / mesh.size("dp");
  const auto [documents, positions] = test::global_documents(kBatches);  // (B, S) each
  test::NamedRun out;
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto [input, labels] = test::global_batch(step, kBatches, small_args().vocab_size);
    const int64_t row = mesh.coordinate("dp") * local;
    const auto rows = [&](const at::Tensor& t) { return t.narrow(0, row, local); };
    const bool packed = step % 2 == 1;
    // Under cp this rank's part of each sequence, and the attention context that says so.
    const parallel::LocalBatch part = parallel.local_batch({.tokens = rows(input),
                                                            .labels = rows(labels),
                                                            .positions = packed ? rows(positions) : at::Tensor(),
                                                            .document_ids = packed ? rows(documents) : at::Tensor()});
    const StepBatch batch{.microbatches = {{part.tokens, part.labels, part.attention}},
                          .tokens = local * kBatches.seq_len,
                          .global_valid_tokens = count_valid_tokens(labels)};
    optimizer.zero_grad();
    out.losses.push_back(forward_backward(parallel, step_model, batch, mesh, at::kCPU).loss);
    out.grad_norms.push_back(optimizer_step(optimizer, kLr, /*max_norm=*/1.0, mesh));
  }
  for (size_t i = 0; i < params.size(); ++i) out.weights[names[i]] = parallel::full_tensor(params[i], mesh);
  return out;
}

test::NamedRun train(const dist::Mesh& mesh) { return train_with(mesh, AcMode::none); }

}  // namespace

TEST_CASE("qwen3_5 with Gated DeltaNet blocks trains under FSDP 2 as in one process",
          "[models][qwen3_5][fsdp][parity]") {
  test::check_named_runs({.dp_shard = 2}, train);
}

TEST_CASE("qwen3_5 with Gated DeltaNet heads split over TP 2 trains as in one process",
          "[models][qwen3_5][tp][parity]") {
  test::check_named_runs({.tp = 2}, train);
}

// Context parallelism by state passing: each cp rank continues the previous rank's convolution inputs and delta-rule
// state (the documents of the odd steps cross the cp boundaries at 8, 16 and 24); the full-attention block attends
// across the split with the K/V all-gather.
TEST_CASE("qwen3_5 with Gated DeltaNet state passing trains under CP 2 as in one process",
          "[models][qwen3_5][cp][parity]") {
  test::check_named_runs({.cp = 2}, train);
}

TEST_CASE("qwen3_5 with Gated DeltaNet state passing trains under CP 4 as in one process",
          "[models][qwen3_5][cp][parity]") {
  test::check_named_runs({.cp = 4}, train);
}

// Under full activation checkpointing each block's recompute in backward receives and sends its carry again, in the
// same order on every rank.
TEST_CASE("qwen3_5 with Gated DeltaNet state passing trains under CP 2 with full activation checkpointing",
          "[models][qwen3_5][cp][ac][parity]") {
  test::check_named_runs({.cp = 2}, [](const dist::Mesh& mesh) { return train_with(mesh, AcMode::full); });
}

TEST_CASE("qwen3_5 trains under FSDP 2 x TP 2 as in one process", "[models][qwen3_5][tp][fsdp][parity][full]") {
  test::check_named_runs({.dp_shard = 2, .tp = 2}, train);
}

}  // namespace qwen3_5_train_test
