// SPDX-License-Identifier: BSD-3-Clause
// What a model of one's own needs from tensor parallelism, each on a model of its own, TP 2 against one rank (output
// and every parameter's whole gradient): biased projections (a colwise bias split with its output features, a
// rowwise bias added once after the sum, its gradient whole under a replicated and a sequence-sharded output), a head
// tied to a vocab-parallel embedding (and the same model under FSDP), a learned position embedding whose output each
// rank keeps its sequence shard of. Tolerance 1e-5 relative, 1e-6 absolute: one forward and backward in fp32 whose
// sums the layouts reorder (~1e-7 relative each); a bias counted twice or a gradient summed once too often is off by
// its own size.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <functional>
#include <map>

#include "parallel/parity_check.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/layout/module_hooks.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/layers.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/parallel/tensor_parallel.hpp"

using namespace titan;
using parallel::Placement;
using test::error_of;
using test::kFast;

namespace {

constexpr int64_t kBatch = 2, kSeq = 8, kDim = 8, kVocab = 16;

// An MLP with biases, its forward through module_call so a plan can prepare its input.
struct BiasedMlp : torch::nn::Module {
  BiasedMlp()
      : up(register_module("up", std::make_shared<nn::Linear>(kDim, 4 * kDim, at::TensorOptions(), /*bias=*/true))),
        down(register_module("down", std::make_shared<nn::Linear>(4 * kDim, kDim, at::TensorOptions(), true))) {}
  at::Tensor forward(const at::Tensor& x) const {  // (B, S, D) -> (B, S, D)
    return parallel::module_call(*this, x,
                                 [&](const at::Tensor& in) { return down->forward(at::gelu(up->forward(in))); });
  }
  std::shared_ptr<nn::Linear> up;    // weight (4D, D), bias (4D)
  std::shared_ptr<nn::Linear> down;  // weight (D, 4D), bias (D)
};
struct MlpModel : torch::nn::Module {
  MlpModel() : mlp(register_module("mlp", std::make_shared<BiasedMlp>())) {}
  std::shared_ptr<BiasedMlp> mlp;
};

// Token embedding tied to the head.
struct TiedModel : torch::nn::Module {
  TiedModel()
      : embed(register_module("embed", std::make_shared<nn::Embedding>(kVocab, kDim, at::TensorOptions()))),
        head(register_module("head", std::make_shared<nn::TiedLinear>(embed))) {}
  at::Tensor forward(const at::Tensor& tokens) const {  // (B, S) -> (B, S, V), or (B, S, V/tp) under loss parallel
    return head->forward(at::tanh(embed->forward(tokens)));
  }
  parallel::ShardingSpec spec(bool sequence_parallel) const {
    using Role = parallel::TensorParallelRole;
    return {.model = "tied",
            .fsdp_units = {{"embed"}, {"head"}},
            .tensor_parallel = {{"embed", Role::vocab_embedding}, {"head", Role::head}},
            .sequence_parallel = sequence_parallel,
            .tied = {{"head.weight", "embed.weight"}}};
  }
  std::shared_ptr<nn::Embedding> embed;  // weight (V, D)
  std::shared_ptr<nn::TiedLinear> head;  // reads embed.weight
};

// Token and learned position embeddings, summed.
struct PositionModel : torch::nn::Module {
  PositionModel()
      : tok(register_module("tok", std::make_shared<nn::Embedding>(kVocab, kDim, at::TensorOptions()))),
        pos(register_module("pos", std::make_shared<nn::Embedding>(kSeq, kDim, at::TensorOptions()))) {}
  at::Tensor forward(const at::Tensor& tokens) const {  // (B, S) -> (B, S, D), under SP this rank's (B, S/tp, D)
    return tok->forward(tokens) + pos->forward(at::arange(tokens.size(1), at::kLong).unsqueeze(0));
  }
  parallel::ShardingSpec spec(bool sequence_parallel) const {
    using Role = parallel::TensorParallelRole;
    return {.model = "positions",
            .tensor_parallel = {{"tok", Role::vocab_embedding}, {"pos", Role::position_embedding}},
            .sequence_parallel = sequence_parallel};
  }
  std::shared_ptr<nn::Embedding> tok;  // weight (V, D)
  std::shared_ptr<nn::Embedding> pos;  // weight (S, D)
};

struct Outcome {
  at::Tensor output{};                        // what this rank's forward returned
  std::map<std::string, at::Tensor> grads{};  // each parameter's whole gradient, by name
};

// Parallelizes `model` by `plan`, fills every parameter from its name (the same whole tensors on any layout), runs
// `forward` (its output and loss) and backward, and reads each parameter's whole gradient: one step of plain descent
// (lr 1) on every rank, the whole tensor's change.
template <class M>
Outcome one_pass(M& model, const dist::Mesh& mesh, const parallel::ParallelPlan& plan,
                 const std::function<std::pair<at::Tensor, at::Tensor>(const M&, const Parallelized&)>& forward) {
  const Parallelized parallel = parallelize(model, mesh, plan);
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    nn::normal_(item.value(), nn::InitSite(3) / item.key(), 0.0, 0.5);
    item.value().requires_grad_(true);
  }
  auto [output, loss] = forward(model, parallel);
  loss.backward();
  Outcome out{.output = output.detach()};
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor before = parallel::full_tensor(item.value(), mesh);
    item.value().sub_(item.value().grad());
    out.grads[item.key()] = before - parallel::full_tensor(item.value(), mesh);
  }
  return out;
}

// Fixed weights of the output in the loss (the same on every rank), so no gradient is uniform.
at::Tensor loss_weights(int64_t vocab_or_dim) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  return at::randn({kBatch, kSeq, vocab_or_dim}, gen);  // (B, S, D)
}

at::Tensor tokens() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  return at::randint(kVocab, {kBatch, kSeq}, gen, at::kLong);  // (B, S)
}

// This rank's chunk of a whole (B, S, ...) tensor along the sequence, or all of it.
at::Tensor local(const at::Tensor& whole, const dist::Mesh& mesh, bool sequence_sharded) {
  const int64_t n = mesh.size("tp");
  return sequence_sharded ? whole.chunk(n, 1)[static_cast<size_t>(mesh.coordinate("tp"))] : whole;
}

void check_same(const Outcome& got, const Outcome& want, const at::Tensor& want_output) {
  RANK_CHECK_INFO((got.output - want_output).abs().max().item<double>(),
                  at::allclose(got.output, want_output, 1e-5, 1e-6));
  RANK_CHECK(got.grads.size() == want.grads.size());
  for (const auto& [name, grad] : want.grads) {
    const at::Tensor& g = got.grads.at(name);
    RANK_CHECK_INFO(name << " max abs diff " << (g - grad).abs().max().item<double>(),
                    at::allclose(g, grad, 1e-5, 1e-6));
  }
}

}  // namespace

TEST_CASE("biased colwise and rowwise projections under TP 2 match one rank, sequence-sharded or replicated",
          "[parallel][tp][bias]") {
  const bool sequence_parallel = GENERATE(true, false);
  INFO("sequence parallel " << sequence_parallel);
  const at::Tensor x = loss_weights(kDim).mul(0.7).add(0.1);  // (B, S, D), the input
  const at::Tensor w = loss_weights(kDim);                    // (B, S, D)
  const auto forward = [&](const dist::Mesh& mesh) {
    return [&, sp = sequence_parallel](const MlpModel& m, const Parallelized&) {
      const at::Tensor y = m.mlp->forward(local(x, mesh, sp));  // (B, S, D) or this rank's (B, S/tp, D)
      return std::pair{y, (y * local(w, mesh, sp)).sum()};
    };
  };
  MlpModel whole;
  const dist::Mesh one;
  const Outcome want = one_pass<MlpModel>(whole, one, {}, forward(one));
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2}, rank, store, kFast);
    parallel::ParallelPlan plan;
    const Placement between = sequence_parallel ? Placement::shard(1) : Placement::replicate();
    if (sequence_parallel) plan.tensor_parallel.add("mlp", parallel::PrepareModuleInput{.input_layout = between});
    plan.tensor_parallel.add("mlp.up", parallel::ColwiseParallel{})
        .add("mlp.down", parallel::RowwiseParallel{.output_layout = between});
    MlpModel model;
    const Outcome got = one_pass<MlpModel>(model, mesh, plan, forward(mesh));
    // The colwise bias is split with the output features; the rowwise bias stays whole on each rank.
    RANK_CHECK(model.mlp->up->bias.size(0) == 4 * kDim / 2);
    RANK_CHECK(model.mlp->down->bias.size(0) == kDim);
    check_same(got, want, local(want.output, mesh, sequence_parallel));
  });
}

TEST_CASE("a head tied to a vocab-parallel embedding matches one rank under TP 2 and FSDP 2", "[parallel][tp][tied]") {
  const auto [shape, sequence_parallel, loss_parallel] =
      GENERATE(std::tuple{dist::MeshShape{.tp = 2}, true, true}, std::tuple{dist::MeshShape{.tp = 2}, false, false},
               std::tuple{dist::MeshShape{.dp_shard = 2}, true, true});
  INFO(fmt::format("{}, sequence parallel {}, loss parallel {}", shape, sequence_parallel, loss_parallel));
  const at::Tensor labels = tokens().roll(1, 1);  // (B, S)
  // Each data-parallel rank takes its rows (FSDP sums the ranks' gradients).
  const auto rows = [](const at::Tensor& t, const dist::Mesh& mesh) {
    return t.chunk(mesh.size("dp"), 0)[static_cast<size_t>(mesh.coordinate("dp"))];
  };
  const auto forward = [&](const dist::Mesh& mesh) {
    return [&](const TiedModel& m, const Parallelized& parallel) {
      const at::Tensor logits = m.forward(rows(tokens(), mesh));  // (B, S, V) or (B, S, V/tp)
      return std::pair{logits, parallel.cross_entropy_sum(logits, rows(labels, mesh))};
    };
  };
  TiedModel whole;
  const dist::Mesh one;
  const Outcome want = one_pass<TiedModel>(whole, one, {}, forward(one));
  REQUIRE(want.grads.size() == 1);  // the head owns no parameter
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh(shape, rank, store, kFast);
    TiedModel model;
    parallel::PlanOptions options;
    options.parallelism.disable_loss_parallel = !loss_parallel;
    const Outcome got = one_pass<TiedModel>(
        model, mesh, parallel::plan(model.spec(sequence_parallel), options, mesh.shape()), forward(mesh));
    const bool vocab_sharded = shape.tp > 1 && loss_parallel;
    const at::Tensor mine = rows(want.output, mesh);  // (B/dp, S, V)
    check_same(got, want, vocab_sharded ? mine.chunk(2, -1)[static_cast<size_t>(mesh.coordinate("tp"))] : mine);
  });
}

TEST_CASE("a tied head is refused where its vocabulary split is not built", "[parallel][tp][tied][plan]") {
  const TiedModel model;
  // A plan sharding the head but not the embedding whose weight it reads.
  parallel::TensorParallelPlan head_only;
  head_only.add("head", parallel::ColwiseParallel{});
  CHECK_THAT(error_of([&] { parallel::detail::validate_tensor_parallel(model, head_only, 2); }),
             Catch::Contains("expected the tied head 'head' (ColwiseParallel) after the embedding"));
  // A spec whose tied user has no head role.
  parallel::ShardingSpec no_head = model.spec(true);
  no_head.tensor_parallel.pop_back();
  CHECK_THAT(error_of([&] { (void)parallel::plan(no_head, {}, {.tp = 2}); }),
             Catch::Contains("expected a head module declared for the tied weights head.weight -> embed.weight"));
  // Pipeline stages would each need the one tensor.
  CHECK_THAT(error_of([&] { (void)parallel::plan(model.spec(true), {}, {.pp = 2}); }),
             Catch::Contains("[tied::plan] expected no tied weights under pipeline parallelism"));
}

TEST_CASE("a learned position embedding keeps each rank's sequence shard under sequence parallelism",
          "[parallel][tp][positions]") {
  const bool sequence_parallel = GENERATE(true, false);
  INFO("sequence parallel " << sequence_parallel);
  const at::Tensor w = loss_weights(kDim);  // (B, S, D)
  const auto forward = [&](const dist::Mesh& mesh) {
    return [&, sp = sequence_parallel](const PositionModel& m, const Parallelized&) {
      const at::Tensor y = m.forward(tokens());  // (B, S, D), or this rank's (B, S/tp, D)
      return std::pair{y, (y * local(w, mesh, sp)).sum()};
    };
  };
  PositionModel whole;
  const dist::Mesh one;
  const Outcome want = one_pass<PositionModel>(whole, one, {}, forward(one));
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2}, rank, store, kFast);
    PositionModel model;
    const Outcome got = one_pass<PositionModel>(
        model, mesh, parallel::plan(model.spec(sequence_parallel), {}, mesh.shape()), forward(mesh));
    RANK_CHECK(model.pos->weight.size(0) == kSeq);  // whole on every rank
    check_same(got, want, local(want.output, mesh, sequence_parallel));
  });
}

TEST_CASE("the planner gives position embeddings a sequence-sharded output and checks its layouts",
          "[parallel][tp][positions][plan]") {
  const PositionModel model;
  const std::string with = fmt::format(
      "{}", parallel::ParallelPlan{.tensor_parallel = parallel::tensor_parallel_plan(model.spec(true), 2, true, true)});
  CHECK_THAT(with, Catch::Contains("pos: PrepareModuleOutput(output=Replicate(), desired=Shard(1))\n"));
  const std::string without = fmt::format(
      "{}",
      parallel::ParallelPlan{.tensor_parallel = parallel::tensor_parallel_plan(model.spec(false), 2, false, true)});
  CHECK_THAT(without, !Catch::Contains("pos:"));  // a replicated residual stream needs nothing
  parallel::TensorParallelPlan same;
  same.add("pos", parallel::PrepareModuleOutput{.desired_output_layout = Placement::replicate()});
  CHECK_THAT(error_of([&] { parallel::detail::validate_tensor_parallel(model, same, 2); }),
             Catch::Contains("expected 'pos' (PrepareModuleOutput) to go from Replicate() to Shard(d)"));
}
