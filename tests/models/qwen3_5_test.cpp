// SPDX-License-Identifier: BSD-3-Clause
// Qwen3.5 and Qwen3.5-MoE: every flavor's parameter count against transformers' model built from the config.json
// titan exports for it (the oracle, on the meta device), the block kinds and parameter names, forward and backward
// of both debug models, and the refusals of what is not built, in titan's error form. Then the memory planner's
// model of a Gated DeltaNet block against the memory tracker: what is still alive after the layer's forward, less
// its output, is what autograd saved, and the model counts each such tensor (the chunked rule's per-chunk states
// among them, and under cp the carry received from the previous rank), so the two are equal to the byte.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "dist/rank_test_util.hpp"
#include "test_util.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/qwen3_5/hf_adapter.hpp"
#include "titan/models/qwen3_5/model.hpp"
#include "titan/nn/gated_deltanet.hpp"
#include "titan/nn/init.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/planner/memory_plan.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace qwen3_5_test {

using titan::qwen3_5::Qwen35;
using titan::qwen3_5::Qwen35Args;

namespace {

std::shared_ptr<Qwen35> meta_model(const Qwen35Args& args) {
  return std::make_shared<Qwen35>(args, 64, at::TensorOptions().device(at::kMeta));
}

}  // namespace

TEST_CASE("qwen3_5 flavors' parameter counts equal transformers' models built from their configs",
          "[models][qwen3_5][full]") {
  titan::test::TempDir dir;
  nlohmann::json configs;
  std::map<std::string, int64_t> counts;
  const auto add = [&](const std::string& name, const Qwen35Args& args) {
    const auto model = meta_model(args);
    configs[name] = titan::qwen3_5::hf_adapter(args)->hf_config(at::kBFloat16);
    counts[name] = model->num_params();
  };
  for (const auto& name : titan::qwen3_5::flavor_names()) add(name, titan::qwen3_5::flavor(name));
  for (const auto& name : titan::qwen3_5::moe_flavor_names()) add(name, titan::qwen3_5::moe_flavor(name));
  const auto in = dir.path / "configs.json", out = dir.path / "counts.json";
  titan::test::write_file(in, configs.dump());
  REQUIRE(titan::test::run_python("qwen3_5_oracle.py",
                                  fmt::format("counts \"{}\" \"{}\"", in.string(), out.string())) == 0);
  const nlohmann::json oracle = nlohmann::json::parse(titan::test::read_file(out));
  REQUIRE(oracle.size() == counts.size());
  for (const auto& [name, count] : counts) {
    INFO(name);
    CHECK(count == oracle.at(name).get<int64_t>());
  }
  // The published sizes are what their names say (0.8B counts its tied embedding once).
  CHECK(counts.at("0.8B") == Approx(0.75e9).epsilon(0.1));
  CHECK(counts.at("9B") == Approx(9e9).epsilon(0.1));
  CHECK(counts.at("27B") == Approx(27e9).epsilon(0.1));
  CHECK(counts.at("35B-A3B") == Approx(35e9).epsilon(0.1));
}

TEST_CASE("qwen3_5 blocks alternate three Gated DeltaNet blocks and one gated softmax attention", "[models][qwen3_5]") {
  const auto model = meta_model(titan::qwen3_5::flavor("debugmodel"));
  for (const auto& block : model->layers) {
    INFO("block " << block->layer_id);
    const bool full = block->layer_id % 4 == 3;
    CHECK((block->attention_as<titan::nn::Attention>() != nullptr) == full);
    CHECK((block->attention_as<titan::nn::GatedDeltaNet>() != nullptr) == !full);
  }
  const auto named = model->named_parameters(/*recurse=*/true);
  // Gated attention: wq and its gate wg (8 heads of 64), a quarter of each head rotated.
  CHECK(named["layers.3.attention.wq.weight"].sizes() == at::IntArrayRef({8 * 64, 256}));
  CHECK(named["layers.3.attention.wg.weight"].sizes() == at::IntArrayRef({8 * 64, 256}));
  CHECK(model->layers[3]->attention_as<titan::nn::Attention>()->rotary_dim == 16);
  // Gated DeltaNet: 4 key heads of 32, 8 value heads of 32, a 4-tap convolution per q/k/v channel.
  CHECK(named["layers.0.attention.wq.weight"].sizes() == at::IntArrayRef({4 * 32, 256}));
  CHECK(named["layers.0.attention.wv.weight"].sizes() == at::IntArrayRef({8 * 32, 256}));
  CHECK(named["layers.0.attention.conv_v.weight"].sizes() == at::IntArrayRef({8 * 32, 4}));
  CHECK(named["layers.0.attention.decay.weight"].sizes() == at::IntArrayRef({8}));  // log A
  CHECK(named["layers.0.attention.wa.bias"].sizes() == at::IntArrayRef({8}));       // dt_bias
  CHECK(named["layers.0.attention.norm.weight"].sizes() == at::IntArrayRef({32}));
  CHECK_FALSE(named.contains("layers.0.attention.wg.weight"));
  CHECK_FALSE(named.contains("output.weight"));  // debugmodel ties the output to the embedding
  const auto moe = meta_model(titan::qwen3_5::moe_flavor("debugmodel_moe"))->named_parameters(/*recurse=*/true);
  CHECK(moe["layers.0.moe.experts.w1"].sizes() == at::IntArrayRef({8, 128, 256}));
  CHECK(moe["layers.0.moe.shared_experts.w1.weight"].sizes() == at::IntArrayRef({128, 256}));
  CHECK(moe["layers.0.moe.shared_gate.weight"].sizes() == at::IntArrayRef({1, 256}));
  CHECK_FALSE(moe.contains("layers.0.feed_forward.w1.weight"));
  // FLOPs: 6N plus the softmax term of the 2 full-attention blocks and the recurrence of the 6 others.
  const auto dense = meta_model(titan::qwen3_5::flavor("debugmodel"));
  const int64_t softmax = 6 * 8 * (64 + 64) * 2048, recurrence = 18 * 8 * 32 * 32;
  CHECK(dense->num_flops_per_token(2048) - dense->num_flops_per_token(1024) == 2 * (softmax - softmax / 2));
  CHECK(dense->num_flops_per_token(2048) ==
        6 * dense->num_params() + 2 * softmax + 6 * recurrence);  // tied: the embedding is the head's matmul
}

TEST_CASE("qwen3_5 debugmodel and debugmodel_moe run forward and backward", "[models][qwen3_5][full]") {
  const bool moe = GENERATE(false, true);
  INFO("moe " << moe);
  at::manual_seed(3);
  titan::nn::manual_init_seed(3);
  Qwen35 model(moe ? titan::qwen3_5::moe_flavor("debugmodel_moe") : titan::qwen3_5::flavor("debugmodel"), 80,
               at::TensorOptions());
  model.init_weights();
  const at::Tensor tokens = at::randint(0, model.vocab_size(), {1, 81}, at::kLong);  // (B, S+1): two 64-token chunks
  const at::Tensor logits = model.forward(tokens.narrow(1, 0, 80));                  // (B, S, V)
  const at::Tensor loss = at::cross_entropy_loss(logits.flatten(0, 1), tokens.narrow(1, 1, 80).flatten());
  loss.backward();
  // At init the normed hidden state has unit RMS and the output rows std D^-1/2: logits of std ~1 (a wrong scale
  // or a broken block lands far from it). The loss itself is not log(V): a tied model's residual stream is still
  // mostly the input token's own embedding row, which the output scores high.
  CHECK(logits.std().item<double>() == Approx(1.0).margin(0.3));
  CHECK(std::isfinite(loss.item<double>()));
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    INFO(item.key());
    const at::Tensor& g = item.value().grad();
    REQUIRE(g.defined());
    CHECK(at::isfinite(g).all().item<bool>());
    CHECK(g.abs().sum().item<double>() > 0);  // every tensor learns
  }
  // Zero-centred norms start at 0 (a scale of 1); the output norm of Gated DeltaNet at 1.
  CHECK(model.layers[0]->attention_norm->weight.eq(0).all().item<bool>());
  CHECK(model.layers[0]->attention_as<titan::nn::GatedDeltaNet>()->norm->weight.eq(1).all().item<bool>());
}

TEST_CASE("qwen3_5 computes each packed document as if it ran alone", "[models][qwen3_5]") {
  // Linear blocks restart their state and convolution at a document; the full-attention block masks across it and
  // rotates by positions within it. Tolerance: the same fp32 math over other chunk boundaries, ~1e-6 on logits ~1.
  Qwen35Args a{
      .dim = 64,
      .n_layers = 4,
      .n_heads = 4,
      .n_kv_heads = 2,
      .head_dim = 16,
      .vocab_size = 128,
      .hidden_dim = 128,
      .max_seq_len = 64,
      .linear = {.n_key_heads = 2, .n_value_heads = 4, .key_head_dim = 16, .value_head_dim = 8, .chunk_size = 8}};
  titan::nn::manual_init_seed(9);
  Qwen35 model(a, 24, at::TensorOptions());
  model.init_weights();
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::randint(0, 128, {1, 24}, at::kLong);                   // (B, S)
  const at::Tensor ids = (at::arange(24, at::kLong) >= 9).to(at::kLong).unsqueeze(0);  // (B, S): 9 + 15 tokens
  const at::Tensor positions = at::arange(24, at::kLong).unsqueeze(0) - 9 * ids;
  const at::Tensor packed = model.forward(tokens, {.positions = positions, .document_ids = ids});  // (B, S, V)
  const at::Tensor first = model.forward(tokens.narrow(1, 0, 9));
  const at::Tensor second = model.forward(tokens.narrow(1, 9, 15));
  INFO("max diff " << (packed.narrow(1, 9, 15) - second).abs().max().item<double>());
  CHECK(at::allclose(packed.narrow(1, 0, 9), first, 0, 1e-5));
  CHECK(at::allclose(packed.narrow(1, 9, 15), second, 0, 1e-5));
  // Without the ids the second document sees the first: a different function.
  CHECK_FALSE(at::allclose(model.forward(tokens).narrow(1, 9, 15), second, 0, 1e-3));
}

TEST_CASE("qwen3_5 refuses load-balanced context parallelism and a tied pipeline with the reason and plans pp and ep",
          "[models][qwen3_5][errors]") {
  const auto dense = meta_model(titan::qwen3_5::flavor("debugmodel"));
  const auto plan_on = [&](const Qwen35& model, const titan::dist::MeshShape& mesh) {
    return titan::test::error_of([&] { titan::parallel::plan(model.sharding_spec(), {}, mesh); });
  };
  // Context parallelism over contiguous shards only: the Gated DeltaNet state passes from each cp rank to the next.
  CHECK_THAT(plan_on(*dense, {.cp = 2}),
             Catch::Contains("[titan::qwen3_5::plan] expected parallelism.context_parallel_load_balancer None under "
                             "cp = 2, got headtail") &&
                 Catch::Contains("Gated DeltaNet"));
  const titan::parallel::ParallelPlan cp = titan::parallel::plan(
      dense->sharding_spec(), {.parallelism = {.context_parallel_load_balancer = std::nullopt}}, {.cp = 2});
  CHECK_FALSE(cp.context_parallel.load_balance);
  CHECK(cp.context_parallel.attention_modules.size() == 8);  // the Gated DeltaNet blocks' and the full attention's
  const auto moe = meta_model(titan::qwen3_5::moe_flavor("debugmodel_moe"));
  // A tied flavor's pipeline: its first and last stage would share the embedding.
  CHECK_THAT(plan_on(*dense, {.pp = 2}),
             Catch::Contains("expected pp = 1, got 2") && Catch::Contains("tie_word_embeddings"));
  // The untied MoE flavor cuts into stages and splits its routed experts over ep.
  const titan::parallel::ParallelPlan pp = titan::parallel::plan(moe->sharding_spec(), {}, {.pp = 2});
  REQUIRE(pp.pipeline.stages.size() == 2);
  CHECK(pp.pipeline.stages.front().front() == "tok_embeddings");
  CHECK(pp.pipeline.stages.back().back() == "output");
  const titan::parallel::ParallelPlan ep = titan::parallel::plan(moe->sharding_spec(), {}, {.dp_shard = 2, .ep = 2});
  CHECK(ep.expert_parallel.moe_modules.size() == 8);
  // Tensor parallelism splits a Gated DeltaNet block's heads: projections, convolution channels and decay rates.
  // (Untied: the skeleton's tied output has no vocab-parallel head.)
  Qwen35Args untied = titan::qwen3_5::flavor("debugmodel");
  untied.tie_word_embeddings = false;
  const titan::parallel::ParallelPlan tp = titan::parallel::plan(meta_model(untied)->sharding_spec(), {}, {.tp = 2});
  std::map<std::string, std::string> styles;
  for (const auto& [path, style] : tp.tensor_parallel.styles) styles[path] = titan::parallel::format_as(style);
  CHECK_THAT(styles.at("layers.0.attention.conv_v"), Catch::StartsWith("ColwiseParallel"));
  CHECK_THAT(styles.at("layers.0.attention.decay"), Catch::StartsWith("ColwiseParallel"));
  CHECK_THAT(styles.at("layers.0.attention.wo"), Catch::StartsWith("RowwiseParallel"));
  CHECK_THAT(styles.at("layers.3.attention.wg"), Catch::StartsWith("ColwiseParallel"));
  CHECK_FALSE(styles.contains("layers.0.attention.wg"));
  // FSDP is built.
  const titan::parallel::ParallelPlan fsdp = titan::parallel::plan(dense->sharding_spec(), {}, {.dp_shard = 2});
  CHECK(fsdp.data_parallel.units.size() == 1 + 8 + 1);
  // A config transformers would not load is refused naming the key.
  nlohmann::json hf = titan::qwen3_5::hf_adapter(titan::qwen3_5::flavor("debugmodel"))->hf_config(at::kFloat);
  hf["layer_types"] = std::vector<std::string>{"full_attention", "sliding_attention"};
  CHECK_THROWS_WITH(titan::qwen3_5::args_from_hf_config(hf),
                    Catch::Contains("[titan::qwen3_5] expected layer_types of n_layers = 8 entries"));
  hf["model_type"] = "qwen3_5";
  CHECK_THROWS_WITH(titan::qwen3_5::args_from_hf_config(hf), Catch::Contains("expected model_type qwen3_5_text"));
}

}  // namespace qwen3_5_test

// The memory planner's count of a Gated DeltaNet block against what its forward really keeps.
namespace memory_plan_qwen3_5_test {
namespace {

using namespace titan;

constexpr int64_t kDim = 32;

struct Kept {
  int64_t measured = 0;
  int64_t planned = 0;
};

// The bytes one forward of a Gated DeltaNet layer leaves alive (its output aside), and the model's count.
Kept kept_by_forward(int64_t value_heads, int64_t seq, const nn::AttentionContext& context = {}) {
  nn::manual_init_seed(4);
  nn::GatedDeltaNet mixer(
      kDim, {.n_key_heads = 2, .n_value_heads = value_heads, .key_head_dim = 8, .value_head_dim = 6, .chunk_size = 4},
      at::TensorOptions());
  mixer.init_weights(nn::InitSite::current() / "mixer", 0.02);
  const int64_t cp = context.sharding ? context.sharding->layout.degree : 1;
  mixer.set_context_parallel_degree(cp);
  const at::Tensor x = at::randn({2, seq, kDim}).requires_grad_(true);  // (B, S, D), not the layer's
  MemoryTracker tracker;
  at::Tensor out;  // (B, S, D)
  {
    const TrackMemory track(tracker);
    const MemoryScope scope(MemoryCategory::activations);
    out = mixer.forward(x, {}, context);
  }
  const int64_t measured = tracker.live(MemoryCategory::activations) - static_cast<int64_t>(out.nbytes());
  const int64_t planned = qwen3_5::attention_memory(mixer, {.b = 2, .s = seq, .tp = 1, .cp = cp, .bytes = 4}).saved;
  out.sum().backward();  // every rank's backward: the state passing's messages back
  return {.measured = measured, .planned = planned};
}

}  // namespace

TEST_CASE("memory plan: a Gated DeltaNet block keeps what the Qwen3.5 memory model counts",
          "[planner][memory_plan][qwen3_5]") {
  for (const int64_t value_heads : {2, 4}) {
    for (const int64_t seq : {12, 10}) {  // three whole chunks of 4; two and a ragged one
      const Kept k = kept_by_forward(value_heads, seq);
      INFO(fmt::format("value heads {} seq {}: measured {} planned {}", value_heads, seq, k.measured, k.planned));
      CHECK(k.measured > 0);
      CHECK(k.planned == k.measured);
    }
  }
}

TEST_CASE("memory plan: a Gated DeltaNet block under CP 2 keeps the carry it received",
          "[planner][memory_plan][qwen3_5][cp]") {
  std::mutex mutex;
  std::vector<Kept> kept(2);
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.cp = 2}, rank, store, test::mesh_options());
    auto sharding = std::make_shared<nn::SequenceSharding>(
        nn::SequenceSharding{.group = std::make_shared<dist::ProcessGroup>(mesh.group("cp")),
                             .layout = {.seq_len = 24, .degree = 2, .rank = rank, .load_balance = false}});
    const Kept k = kept_by_forward(4, 12, {.sharding = sharding});
    std::lock_guard lock(mutex);
    kept[static_cast<size_t>(rank)] = k;
  });
  for (size_t rank = 0; rank < kept.size(); ++rank) {
    INFO(fmt::format("rank {}: measured {} planned {}", rank, kept[rank].measured, kept[rank].planned));
    CHECK(kept[rank].planned == kept[rank].measured);
  }
  // The carried convolution inputs: 2 rows x 3 taps x (16 + 16 + 24) channels x 4 bytes over cp 1's count.
  CHECK(kept[0].planned - kept_by_forward(4, 12).planned == 2 * 3 * 56 * 4);
}

TEST_CASE("memory plan: titan-plan plans Qwen3.5 under context parallelism over contiguous shards",
          "[planner][memory_plan][qwen3_5][cp]") {
  JobConfig c;
  c.model.name = "qwen3_5";
  c.model.flavor = "debugmodel";
  c.training.seq_len = 256;
  c.training.local_batch_size = 2;
  c.parallelism.context_parallel_degree = 2;
  CHECK_THAT(test::error_of([&] { planner::plan_memory(c, {.world_size = 2, .gpu = false}); }),
             Catch::Contains("context_parallel_load_balancer None"));
  c.parallelism.context_parallel_load_balancer = std::nullopt;
  const planner::MemoryPlan cp2 = planner::plan_memory(c, {.world_size = 2, .gpu = false});
  c.parallelism.context_parallel_degree = 1;
  const planner::MemoryPlan one = planner::plan_memory(c, {.world_size = 1, .gpu = false});
  // Half the tokens per rank: the activations fall (the full-attention block's gathered K/V aside).
  CHECK(cp2.activations_per_microbatch < one.activations_per_microbatch);
  CHECK(cp2.activations_per_microbatch > one.activations_per_microbatch / 4);
}

TEST_CASE("memory plan: Qwen3.5's step time under CP waits for the state passing's wavefront once per run",
          "[planner][memory_plan][qwen3_5][cp]") {
  JobConfig c;
  c.model.name = "qwen3_5";
  c.model.flavor = "debugmodel";  // 8 blocks, full attention at 3 and 7: two runs of three Gated DeltaNet blocks
  c.training.seq_len = 256;
  c.training.local_batch_size = 2;
  c.activation_checkpoint.mode = AcMode::none;  // forward and backward only
  c.parallelism.context_parallel_degree = 2;
  c.parallelism.context_parallel_load_balancer = std::nullopt;
  const planner::PlanOptions options{.world_size = 2, .peak_flops = 1e12, .mfu = 0.5, .gpu = false};
  const planner::MemoryPlan plan = planner::plan_memory(c, options);
  REQUIRE(plan.microbatches == 1);
  // By hand, per rank: 2 rows x 128 tokens. The two full-attention blocks gather K and V (2 KV heads x 64, fp32)
  // in forward and reduce-scatter them in backward over the 450 GB/s link.
  const double bw = 450e9, tokens = 2 * 128;
  const double kv = 2 * tokens * (2 * 64) * 4 * (2 - 1) * 2 * 2 / bw;
  // Each run's wavefront fills once per direction: (cp - 1) x (one rank's recurrence + the message). The
  // recurrence: 18 Hv dk dv FLOPs per token forward and backward (8 heads of 32 x 32) at 0.5 x 1e12 FLOP/s; the
  // message: 2 rows x (the state, 8 x 32 x 32, + the 3 carried convolution inputs of 4 x 32 + 4 x 32 + 8 x 32
  // channels) x 4 bytes, once each way.
  const double rule = 18.0 * 8 * 32 * 32 * tokens / (1e12 * 0.5);
  const double message = 2.0 * (8 * 32 * 32 + 3 * (2 * 4 * 32 + 8 * 32)) * 4 / bw;
  CHECK(plan.time.cp == Approx(kv + 2 * (2 - 1) * (rule + 2 * message)).epsilon(1e-9));
  CHECK(plan.step_seconds == Approx(plan.time.total()));
}

TEST_CASE("memory plan: titan-plan plans Qwen3.5-MoE under pipeline and expert parallelism",
          "[planner][memory_plan][qwen3_5][pp][ep]") {
  JobConfig c;
  c.model.name = "qwen3_5_moe";
  c.model.flavor = "debugmodel_moe";  // untied: a pipeline of its own head
  c.training.seq_len = 256;
  c.training.local_batch_size = 4;
  const planner::MemoryPlan one = planner::plan_memory(c, {.world_size = 1, .gpu = false});
  c.parallelism.pipeline_parallel_degree = 2;
  const planner::MemoryPlan pp = planner::plan_memory(c, {.world_size = 2, .gpu = false});
  // The shown pp rank holds half the 8 blocks and the embedding or the head: between a third and all but a third of
  // the one process's weights. Its microbatches are single sequences, a quarter of the one process's forward.
  CHECK(pp.mesh.pp == 2);
  CHECK(pp.microbatches == 4);
  CHECK(3 * pp.parts.parameters > one.parts.parameters);
  CHECK(3 * pp.parts.parameters < 2 * one.parts.parameters);
  CHECK(pp.activations_per_microbatch < one.activations_per_microbatch / 2);
  c.parallelism.pipeline_parallel_degree = 1;
  c.parallelism.data_parallel_shard_degree = 2;
  const planner::MemoryPlan fsdp = planner::plan_memory(c, {.world_size = 2, .gpu = false});
  c.parallelism.expert_parallel_degree = 2;
  const planner::MemoryPlan ep = planner::plan_memory(c, {.world_size = 2, .gpu = false});
  // The same weights per rank (FSDP or ep splits the experts in two), the routed tokens' all-to-all added.
  CHECK(ep.mesh.ep == 2);
  CHECK(ep.expert_dispatch > fsdp.expert_dispatch);
  CHECK(ep.parts.parameters == Approx(fsdp.parts.parameters).epsilon(0.01));
}

}  // namespace memory_plan_qwen3_5_test
