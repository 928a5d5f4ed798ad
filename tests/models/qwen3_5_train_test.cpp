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

#include "models/decoder_train_util.hpp"
#include "test_util.hpp"
#include "titan/models/qwen3_5/model.hpp"

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
  // Contiguous cp shards: the Gated DeltaNet blocks pass their state from each cp rank to the next.
  return test::train_decoder<qwen3_5::Qwen35>(
      mesh, small_args(),
      {.steps = kSteps,
       .lr = kLr,
       .batches = kBatches,
       .seed = 11,
       .options = {.parallelism = {.context_parallel_load_balancer = std::nullopt},
                   .activation_checkpoint = {.mode = checkpoint}}});
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
