// SPDX-License-Identifier: BSD-3-Clause
// Qwen3 under its own parallel plan (the one the Trainer applies): a small Qwen3-MoE (two MoE
// layers, a dense one between them) trained 10 steps under FSDP 2 (routed experts in units of their
// own) and under TP 2 with sequence and loss parallel (q/k norms and MoE weights replicated, their
// gradients summed over tp) matches one rank, expert biases included. Ranks are threads on Gloo. The plan's units and
// styles. The generic driver (examples/train.cpp) trains `--model.name qwen3 --model.flavor debugmodel` with the
// Trainer's checkpoints and metrics: 4 steps equal 2 steps then a resumed process for 2, bitwise.
// The Trainer updates a small Qwen3-MoE's expert biases each step (auxiliary-loss-free balancing),
// logs moe/max_load_ratio, and checkpoints the biases: a resume from step 2 repeats steps 3-4 bitwise.
// Under TP 2 x ETP 2 (experts split over tp on their hidden dim) and TP 2 x EP 2 x ETP 2 the same parity holds,
// with a half and a quarter of the routed experts' bytes per rank. Under Ulysses context parallelism (CP 2 with two
// documents per row, and CP 2 x TP 2, where the one KV head per tp rank is repeated for the two cp ranks) too.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "dist/launch_test_util.hpp"
#include "dist/rank_test_util.hpp"
#include "it_trains.hpp"
#include "models/documents_util.hpp"
#include "models/small_models.hpp"
#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/models/decoder_spec.hpp"
#include "titan/models/qwen3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/optim/clip.hpp"
#include "titan/parallel/context_parallel.hpp"
#include "titan/parallel/expert_parallel.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/step.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace qwen3_train_test {

using namespace titan;

namespace {

constexpr int64_t kSteps = 10;
constexpr int64_t kBatch = 4;  // sequences per step, split over the dp ranks
constexpr int64_t kSeq = 16;
constexpr double kLr = 3e-3;

qwen3::Qwen3Args parity_args() { return test::small_qwen3_moe(); }

JobConfig parity_config() {
  JobConfig c;
  c.model.name = "qwen3";
  c.training.seq_len = kSeq;
  c.activation_checkpoint.mode = AcMode::none;
  c.parallelism.context_parallel_rotate_method = CpRotateMethod::ulysses;  // where the mesh has cp
  return c;
}

struct Result {
  std::vector<double> losses;       // global loss per step
  std::vector<at::Tensor> weights;  // whole parameters after the last step
  std::vector<std::string> names;   // their FQNs
  parallel::ParallelPlan plan;      // the plan applied
  std::vector<at::Tensor> biases;   // each MoE layer's expert bias (E) after the last step
  int64_t expert_bytes = 0;         // this rank's routed-expert weights, as the memory tracker booked them
};

bool is_routed_expert(const std::string& fqn) { return fqn.find(".moe.experts.") != std::string::npos; }

Result train(const dist::Mesh& mesh, int64_t steps = kSteps, bool documents = false) {
  nn::manual_init_seed(42);
  MemoryTracker tracker;
  const TrackMemory track(tracker);
  qwen3::Qwen3 model(parity_args(), kSeq, at::TensorOptions());  // whole: booked to `other`
  Result result;
  result.plan =
      parallel::plan(model.sharding_spec(), parallel::plan_options(parity_config(), model, false), mesh.shape());
  std::map<std::string, const void*> before;  // each parameter's storage before parallelize
  for (const auto& item : model.named_parameters(/*recurse=*/true)) before[item.key()] = item.value().storage().data();
  // What parallelize keeps of each parameter (its local shard) is allocated here, under `parameters`; weights it
  // keeps whole (TP's SequenceParallel ones) stay where they were, booked to `other`.
  const Parallelized applied = [&] {
    const MemoryScope scope(MemoryCategory::parameters);
    return parallelize(model, mesh, result.plan);
  }();
  int64_t dense_bytes = 0;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!is_routed_expert(item.key()) && item.value().storage().data() != before.at(item.key())) {
      dense_bytes += static_cast<int64_t>(item.value().storage().nbytes());
    }
  }
  result.expert_bytes = tracker.live(MemoryCategory::parameters) - dense_bytes;
  model.init_weights();  // after sharding: every rank fills only its shard
  // The Trainer's expert-bias update: counts summed over dp x cp, then each layer's bias (the EP handle
  // under ep > 1; at ep = 1 the layers only recorded).
  const parallel::ExpertParallel moe =
      applied.expert_parallel() != nullptr
          ? *applied.expert_parallel()
          : parallel::apply_expert_parallel(model, mesh, {.moe_modules = parallel::moe_modules(model)});
  const auto params = model.unique_parameters();
  AdamW optimizer(params, {.lr = kLr, .weight_decay = 0.1});
  const LossFn loss = [&applied](const at::Tensor& logits, const at::Tensor& labels) {
    return applied.cross_entropy_sum(logits, labels);
  };
  const int64_t local = kBatch / mesh.size("dp");
  for (int64_t step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    // Learnable sequences: arithmetic progressions mod V, the same global batch on every rank.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
    const at::Tensor start = at::randint(128, {kBatch, 1}, gen, at::kLong);                       // (B, 1)
    const at::Tensor stride = at::randint(1, 5, {kBatch, 1}, gen, at::kLong);                     // (B, 1)
    const at::Tensor tokens = (start + stride * at::arange(kSeq + 1, at::kLong)).remainder(128);  // (B, S+1)
    const int64_t row = mesh.coordinate("dp") * local;
    const auto rows = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, row, local) : t; };
    const auto [ids, positions] =
        documents ? test::two_documents_per_row(kBatch, kSeq) : std::pair<at::Tensor, at::Tensor>();
    // This rank's part of its rows: under cp its tokens of each sequence and the attention context that says so.
    const parallel::LocalBatch part = applied.local_batch({.tokens = rows(tokens).narrow(1, 0, kSeq).contiguous(),
                                                           .labels = rows(tokens).narrow(1, 1, kSeq).contiguous(),
                                                           .positions = rows(positions),
                                                           .document_ids = rows(ids)});
    const std::vector<Microbatch> micro{{.input = part.tokens, .labels = part.labels, .attention = part.attention}};
    const double local_loss =
        forward_backward([&](const at::Tensor& t, const titan::nn::AttentionContext& c) { return model.forward(t, c); },
                         micro, at::kCPU, kBatch * kSeq, false, loss)
            .loss;
    at::Tensor global = at::full({1}, local_loss, at::kDouble);
    mesh.group("dp_cp").all_reduce(global).wait();
    result.losses.push_back(global.item<double>());
    moe.update_expert_bias();
    moe.reduce_expert_gradients();  // the Trainer's call: a no-op where FSDP over efsdp reduced them
    clip_grad_norm_(params, 1.0, &mesh);
    optimizer.step(kLr);
  }
  for (const auto& p : params) result.weights.push_back(parallel::full_tensor(p, mesh));
  for (const auto& layer : moe.layers()) result.biases.push_back(layer->expert_bias.clone());
  for (const auto& p : params) {
    for (const auto& item : model.named_parameters(/*recurse=*/true)) {
      if (item.value().is_same(p)) result.names.push_back(item.key());
    }
  }
  return result;
}

// Tolerances as the Llama parity tests (tests/parallel/parity_check.hpp): fp32 sums reordered across
// ranks (~1e-7 relative per reduction, amplified by AdamW on near-zero gradients): 1e-5 relative on
// losses, 1e-4 relative + 2e-5 absolute on the final weights. Routing is discrete, but no token's
// top-2 sits within 1e-6 of a tie here, so every layout routes every token the same way.
std::vector<Result> check_against_one_rank(const dist::MeshShape& shape, bool documents = false) {
  const Result& one = test::one_rank_reference<Result>(
      documents, [](bool with_documents) { return train(dist::Mesh(), kSteps, with_documents); });
  // That it trains is shown over more steps ("qwen3-moe trains: ..."): at lr 0 these 10 batches alone move
  // the loss by 0.1 from step to step, and the mean of the last three falls below the first three's by 0.27.
  std::mutex mutex;
  std::vector<Result> results(static_cast<size_t>(shape.world_size()));
  dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(shape, rank, store, test::mesh_options(std::chrono::seconds(120)));
    Result r = train(mesh, kSteps, documents);
    std::lock_guard lock(mutex);
    results[static_cast<size_t>(rank)] = std::move(r);
  });
  for (size_t rank = 0; rank < results.size(); ++rank) {
    const Result& r = results[rank];
    INFO(fmt::format("{} rank {}", shape, rank));
    REQUIRE(r.losses.size() == one.losses.size());
    for (size_t s = 0; s < r.losses.size(); ++s) {
      INFO("step " << s + 1);
      CHECK(r.losses[s] == Approx(one.losses[s]).epsilon(1e-5));
    }
    // The expert biases move (sign updates of 1e-3) and every rank holds one device's: the counts are
    // integers summed exactly, so only a routing flip could differ (1e-5: fp32 rounding of the updates).
    REQUIRE(r.biases.size() == 2);
    REQUIRE(one.biases.size() == 2);
    for (size_t i = 0; i < r.biases.size(); ++i) {
      CHECK(one.biases[i].abs().max().item<double>() > 0);
      CHECK(at::allclose(r.biases[i], one.biases[i], 0, 1e-5));
    }
    REQUIRE(r.names == one.names);
    for (size_t i = 0; i < r.weights.size(); ++i) {
      INFO(r.names[i] << " max abs diff " << (r.weights[i] - one.weights[i]).abs().max().item<double>());
      CHECK(at::allclose(r.weights[i], one.weights[i], 1e-4, 2e-5));
    }
  }
  return results;
}

}  // namespace

TEST_CASE("qwen3 plan: routed experts are FSDP units of their own and MoE and q/k norms are replicated over tp",
          "[models][qwen3][parallel]") {
  const qwen3::Qwen3 model(parity_args(), kSeq, at::TensorOptions().device(at::kMeta));
  const parallel::ShardingSpec spec = model.sharding_spec();
  const auto units = spec.fsdp_units;
  const std::vector<std::vector<std::string>> want{
      {"tok_embeddings"},
      {"layers.0.attention_norm", "layers.0.attention", "layers.0.ffn_norm", "layers.0.moe.router"},
      {"layers.0.moe.experts"},
      {"layers.1"},
      {"layers.2.attention_norm", "layers.2.attention", "layers.2.ffn_norm", "layers.2.moe.router"},
      {"layers.2.moe.experts"},
      {"norm", "output"}};
  CHECK(units == want);
  const std::string tp = format_as(parallel::ParallelPlan{
      .tensor_parallel = parallel::tensor_parallel_plan(spec, 2, /*sequence_parallel=*/true, true)});
  CHECK_THAT(tp, Catch::Contains("layers.0.attention.q_norm: SequenceParallel"));
  CHECK_THAT(tp, Catch::Contains("layers.0.moe: SequenceParallel"));
  CHECK_THAT(tp, Catch::Contains("layers.1.feed_forward.w2: RowwiseParallel"));
  CHECK_FALSE(tp.find("layers.0.feed_forward") != std::string::npos);
  // TP refuses tied embeddings without a head module (debugmodel), naming the model and the tied weights.
  const qwen3::Qwen3 tied(qwen3::flavor("debugmodel"), kSeq, at::TensorOptions().device(at::kMeta));
  CHECK_THROWS_WITH(parallel::tensor_parallel_plan(tied.sharding_spec(), 2, true, true),
                    Catch::Contains("[titan::qwen3::plan] expected a head module declared for the tied weights "
                                    "output.weight -> tok_embeddings.weight"));
}

// The parity runs' 10 steps fall by less than their batch noise allows a check to tell (above); 24 steps of the
// same job on one rank fall beyond it (measured 5.26 -> 4.20, the last 8 steps' mean 1.06 below the first 8's).
TEST_CASE("qwen3-moe trains: 24 steps of the parity job on one rank fall beyond the batch noise",
          "[models][qwen3][train][slow]") {
  CHECK_TRAINS(train(dist::Mesh(), 24).losses);
}

TEST_CASE("qwen3-moe under FSDP 2 matches one rank", "[models][qwen3][parallel][fsdp][parity]") {
  check_against_one_rank({.dp_shard = 2});
}

TEST_CASE("qwen3-moe under TP 2 with sequence and loss parallel matches one rank",
          "[models][qwen3][parallel][tp][parity]") {
  check_against_one_rank({.tp = 2});
}

TEST_CASE("qwen3-moe under Ulysses CP 2 with two documents per row matches one rank",
          "[models][qwen3][parallel][cp][ulysses][parity]") {
  check_against_one_rank({.cp = 2}, /*documents=*/true);
}

TEST_CASE("qwen3-moe under Ulysses CP 2 x TP 2 matches one rank (KV heads repeated over cp)",
          "[models][qwen3][parallel][cp][tp][ulysses][parity]") {
  check_against_one_rank({.cp = 2, .tp = 2});
}

TEST_CASE("qwen3-moe under EP 2 matches one rank", "[models][qwen3][parallel][ep][parity]") {
  check_against_one_rank({.dp_shard = 2, .ep = 2});
}

TEST_CASE("qwen3-moe under EP 2 x efsdp 2 matches one rank and holds half of EP 2's expert bytes per rank",
          "[models][qwen3][parallel][ep][efsdp][parity]") {
  // dp_shard 4 with ep 2: each expert on two ranks (efsdp 2), FSDP-split over them on dim 0 again, gathered
  // per layer for the grouped GEMM and reduce-scattered: 4 experts / (ep 2 x efsdp 2) = 1 per rank.
  const std::vector<Result> sharded = check_against_one_rank({.dp_shard = 4, .ep = 2});
  const std::vector<Result> whole = check_against_one_rank({.dp_replicate = 2, .dp_shard = 2, .ep = 2});
  const qwen3::Qwen3Args args = parity_args();
  // 2 MoE layers x w1, w2, w3 (E, F, D) in fp32: the whole model's routed experts.
  const int64_t all_experts = 2 * 3 * args.moe.num_experts * args.moe_inter_dim * args.dim * 4;
  for (size_t rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    CHECK(whole[rank].expert_bytes == all_experts / 2);    // efsdp 1 (dp_replicate 2): E / ep experts
    CHECK(sharded[rank].expert_bytes == all_experts / 4);  // efsdp 2: half of that
  }
  // The plan applied says so.
  CHECK(sharded[0].plan.expert_parallel.moe_modules == std::vector<std::string>{"layers.0.moe", "layers.2.moe"});
}

TEST_CASE("qwen3-moe under TP 2 x ETP 2 matches one rank and holds half of TP 2's expert bytes per rank",
          "[models][qwen3][parallel][tp][etp][parity]") {
  // Each tp rank routes its sequence shard; the experts' hidden dim (32) is split over tp, the two ranks' slots
  // gathered for the experts and the partial outputs summed back (no ep: the all-to-all over ep is skipped).
  const std::vector<Result> split = check_against_one_rank({.tp = 2, .etp = 2});
  const qwen3::Qwen3Args args = parity_args();
  const int64_t all_experts = 2 * 3 * args.moe.num_experts * args.moe_inter_dim * args.dim * 4;
  for (size_t rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK(split[rank].expert_bytes == all_experts / 2);  // TP 2 alone (etp 1) keeps all of them on each rank
  }
  // The plan leaves the routed experts to expert parallelism and keeps the router's gradient summed over tp.
  const std::string tp = format_as(split[0].plan);
  CHECK_THAT(tp, Catch::Contains("layers.0.moe.router: SequenceParallel"));
  CHECK_FALSE(tp.find("layers.0.moe: SequenceParallel") != std::string::npos);
  CHECK(split[0].plan.expert_parallel.moe_modules == std::vector<std::string>{"layers.0.moe", "layers.2.moe"});
}

TEST_CASE("qwen3-moe under TP 2 x EP 2 x ETP 2 matches one rank with a quarter of the expert bytes per rank",
          "[models][qwen3][parallel][tp][ep][etp][parity]") {
  // 4 ranks: dp_shard 2 = ep 2 (efsdp 1), tp 2 = etp 2: each rank holds 2 of the 4 experts, half of each.
  const std::vector<Result> split = check_against_one_rank({.dp_shard = 2, .tp = 2, .ep = 2, .etp = 2});
  const qwen3::Qwen3Args args = parity_args();
  const int64_t all_experts = 2 * 3 * args.moe.num_experts * args.moe_inter_dim * args.dim * 4;
  for (size_t rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    CHECK(split[rank].expert_bytes == all_experts / 4);
  }
}

TEST_CASE("expert tensor parallelism is refused with the key and the fix where it cannot apply",
          "[models][qwen3][parallel][etp]") {
  // etp must be 1 or tp (torchtitan's ParallelDims constraint).
  ParallelismConfig p;
  p.tensor_parallel_degree = 2;
  p.expert_tensor_parallel_degree = 4;
  try {
    (void)dist::mesh_shape(p, 2);
    FAIL("mesh_shape accepted etp 4 with tp 2");
  } catch (const ConfigError& e) {
    CHECK(e.key() == "parallelism.expert_tensor_parallel_degree");
    CHECK_THAT(e.what(), Catch::Contains("expected expert_tensor_parallel_degree 1 or tensor_parallel_degree (2), "
                                         "got 4. Set parallelism.expert_tensor_parallel_degree to 1"));
  }
  // A TP plan that leaves the whole MoE SequenceParallel would sum each rank's own expert slice over tp.
  std::string error;
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2, .etp = 2}, rank, store, test::mesh_options());
    nn::manual_init_seed(42);
    qwen3::Qwen3 model(parity_args(), kSeq, at::TensorOptions());
    parallel::ParallelPlan plan =
        parallel::plan(model.sharding_spec(), parallel::plan_options(parity_config(), model, false), mesh.shape());
    plan.tensor_parallel = parallel::tensor_parallel_plan(model.sharding_spec(), 2, true, true);
    try {
      (void)parallelize(model, mesh, plan);
    } catch (const std::exception& e) {
      if (rank == 0) error = e.what();
    }
  });
  CHECK_THAT(error, Catch::Contains("[titan::parallel::apply_expert_parallel] expected "
                                    "'layers.0.moe.experts.w1' outside the tensor-parallel plan under expert tensor "
                                    "parallelism (etp 2)"));
  CHECK_THAT(error, Catch::Contains("or set parallelism.expert_tensor_parallel_degree 1"));
}

namespace {

// The debug model on tinyshakespeare (the tests' BPE tokenizer), deterministic, one thread.
std::vector<std::string> driver_args(const std::filesystem::path& dump, int64_t steps) {
  return test::concat(test::debug_job("train", dump, steps, /*local_batch=*/2),
                      {"--model.name", "qwen3", "--lr_scheduler.total_steps", "4", "--checkpoint.enable", "true",
                       "--checkpoint.interval", "2", "--checkpoint.last_save_model_only", "false"});
}

}  // namespace

TEST_CASE("train --model.name qwen3 resumes from its checkpoint bitwise", "[models][qwen3][train][resume][slow]") {
  const std::map<std::string, std::optional<std::string>> env = {
      {"RANK", std::nullopt}, {"WORLD_SIZE", std::nullopt}, {"TITAN_LOG_LEVEL", "info"}};
  test::TempDir straight, resumed;
  test::Subprocess a(driver_args(straight.path, 4), env);
  test::require_exit(a, 0, 300);
  // The trainer counts the model and its FLOPs as it does Llama's.
  CHECK_THAT(a.output(), Catch::Contains("Model qwen3 debugmodel: 31987968 parameters"));
  CHECK_THAT(a.output(), Catch::Contains("training FLOPs/token at seq_len 32"));
  test::Subprocess first(driver_args(resumed.path, 2), env);
  test::require_exit(first, 0, 300);
  test::Subprocess second(driver_args(resumed.path, 4), env);
  test::require_exit(second, 0, 300);
  CHECK_THAT(second.output(), Catch::Contains("Resuming at step 3"));
  const auto want = test::metrics_losses(straight.path), got = test::metrics_losses(resumed.path);
  REQUIRE(want.size() == 4);
  REQUIRE(got.size() == 4);
  for (int64_t step = 1; step <= 4; ++step) {
    INFO("step " << step);
    CHECK(got.at(step) == want.at(step));  // deterministic CPU fp32: the same operations on the same bits
  }
  CHECK(std::abs(want.at(4) - want.at(1)) > 1e-3);  // the steps trained (4 steps of 64 tokens: the sign is chance)
  // An unknown model name is refused by the driver, naming the key.
  test::Subprocess bad({(test::binary_dir() / "bin" / "train").string(), "--model.name", "qwen4"}, env);
  test::require_exit(bad, 1, 60);
  CHECK_THAT(bad.output(), Catch::Contains("model.name") && Catch::Contains("qwen4"));
}

namespace {

// The parity model (4 experts, top-2, load_balance_coeff 1e-3) with the tests' tokenizer's vocab, for the Trainer.
struct TinyQwen3Moe : qwen3::Qwen3 {
  using qwen3::Qwen3::Qwen3;
  static std::shared_ptr<TinyQwen3Moe> build(const qwen3::Qwen3Args& args, const ModelBuild& where) {
    return std::make_shared<TinyQwen3Moe>(args, args.max_seq_len, at::TensorOptions().device(where.device),
                                          where.modules);
  }
};

qwen3::Qwen3Args tiny_moe_args() {
  qwen3::Qwen3Args args = parity_args();
  args.vocab_size = 2048;
  args.max_seq_len = 32;
  return args;
}

JobConfig moe_job(const std::filesystem::path& dump) {
  JobConfig c = test::tinyshakespeare_job(dump, /*seq_len=*/32, /*local_batch=*/2, /*steps=*/4, /*seed=*/7);
  c.model.name = "qwen3";
  c.lr_scheduler.warmup_steps = 2;
  c.metrics.disable_color_printing = true;
  c.metrics.log_freq = 1;
  c.debug.deterministic = true;
  c.activation_checkpoint.mode = AcMode::none;
  c.training.global_batch_size = 4;  // two accumulated microbatches: the counts add up over both
  c.checkpoint.enable = true;
  c.checkpoint.interval = 2;
  c.checkpoint.last_save_model_only = false;
  return c;
}

std::vector<at::Tensor> expert_biases(const torch::nn::Module& model) {
  std::vector<at::Tensor> out;
  for (const auto& item : model.named_buffers()) {
    if (item.key().ends_with(".expert_bias")) out.push_back(item.value().clone());
  }
  return out;
}

}  // namespace

TEST_CASE("qwen3-moe trainer updates the expert bias and resumes it bitwise", "[models][qwen3][train][moe][resume]") {
  test::TempDir straight, resumed;
  Trainer<TinyQwen3Moe> a(moe_job(straight.path), tiny_moe_args());
  a.train();
  const std::vector<double> want = a.core().loss_history();
  const std::vector<at::Tensor> bias = expert_biases(a.model());
  REQUIRE(want.size() == 4);
  REQUIRE(bias.size() == 2);  // layers 0 and 2 are MoE
  for (const at::Tensor& b : bias) {
    // sign updates of 1e-3 per step, centred: nonzero unless all four steps were exactly balanced.
    CHECK(b.abs().max().item<double>() > 0);
    CHECK(std::abs(b.sum().item<double>()) < 1e-6);  // each update has zero mean (fp32 rounding)
  }
  // Every logged step carries the worst layer's max load over mean load (>= 1 by definition, <= 4 experts).
  std::istringstream lines(test::read_file(straight.path / "metrics.jsonl"));
  int64_t logged = 0;
  for (std::string line; std::getline(lines, line); ++logged) {
    const double ratio = nlohmann::json::parse(line).at("moe/max_load_ratio").get<double>();
    CHECK(ratio >= 1.0);
    CHECK(ratio <= 4.0);
  }
  CHECK(logged == 4);
  // Resume from the step-2 checkpoint: steps 3 and 4 repeat bitwise only if the biases were restored.
  std::filesystem::create_directories(resumed.path / "checkpoint");
  std::filesystem::copy(straight.path / "checkpoint" / "step-2", resumed.path / "checkpoint" / "step-2",
                        std::filesystem::copy_options::recursive);
  Trainer<TinyQwen3Moe> b(moe_job(resumed.path), tiny_moe_args());
  b.train();
  const std::vector<double> got = b.core().loss_history();
  REQUIRE(got.size() == 2);
  CHECK(got[0] == want[2]);  // deterministic CPU fp32: the same operations on the same bits
  CHECK(got[1] == want[3]);
  const std::vector<at::Tensor> resumed_bias = expert_biases(b.model());
  REQUIRE(resumed_bias.size() == bias.size());
  for (size_t i = 0; i < bias.size(); ++i) CHECK(at::equal(resumed_bias[i], bias[i]));
}

}  // namespace qwen3_train_test
