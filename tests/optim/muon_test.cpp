// SPDX-License-Identifier: BSD-3-Clause
// Muon in one process against torch.optim.Muon (torch 2.11, the oracle: tests/oracles/torch_muon.py): tall, wide and
// square matrices, a step where one has no gradient, Nesterov or not, both lr adjustments. Tolerance 1e-6 on the
// weights and momentum: titan runs torch's ATen ops in torch's order on the same LibTorch build, one thread on both
// sides (the oracle sets it; ctest sets OMP_NUM_THREADS=1), so the results are expected bit for bit (measured: 0).
// A rounding that differs inside Newton-Schulz shows above it: it moves an element of the bf16 update O by one bf16
// ulp, at least 2^-8 of its value (O's entries are ~0.1 here: ~4e-4), which lr x ratio (at least 1e-2) makes a weight
// change of ~4e-6. The element-wise steps (momentum, decay, the update) with another formula differ by far more.
// Also: routing (what steps with Muon, what with AdamW) and the errors of a bad config.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/optim/muon.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace muon_test {

using namespace titan;

namespace {

constexpr int64_t kSteps = 4;
const std::vector<std::vector<int64_t>> kShapes = {{48, 32}, {32, 48}, {40, 40}};
// (step, matrix) pairs without a gradient: torch leaves that matrix and its momentum alone that step.
const std::vector<std::pair<int64_t, size_t>> kNoGrad = {{2, 1}};

OptimizerConfig nesterov_original() {
  return {.name = OptimizerName::muon, .lr = 2e-2, .muon_lr = 2e-2, .muon_weight_decay = 0.1};
}

OptimizerConfig plain_rms_matched() {
  return {.name = OptimizerName::muon,
          .lr = 1e-2,
          .muon_lr = 1e-2,
          .muon_weight_decay = 0.05,
          .muon_momentum = 0.9,
          .muon_nesterov = false,
          .muon_ns_coefficients = {3.0, -3.2, 1.2},
          .muon_eps = 1e-6,
          .muon_ns_steps = 3,
          .muon_adjust_lr_fn = MuonAdjustLr::match_rms_adamw};
}

const std::vector<OptimizerConfig>& cases() {
  static const std::vector<OptimizerConfig> all = {nesterov_original(), plain_rms_matched()};
  return all;
}

/// torch's results for cases(), made once per test run.
const checkpoint::SafetensorsFile& oracle() {
  static test::TempDir dir;
  static const checkpoint::SafetensorsFile file = [] {
    nlohmann::json spec = {{"shapes", kShapes}, {"steps", kSteps}, {"no_grad", kNoGrad}};
    for (const OptimizerConfig& c : cases()) {
      spec["cases"].push_back({{"lr", c.muon_lr},
                               {"weight_decay", c.muon_weight_decay},
                               {"momentum", c.muon_momentum},
                               {"nesterov", c.muon_nesterov},
                               {"ns_coefficients", c.muon_ns_coefficients},
                               {"eps", c.muon_eps},
                               {"ns_steps", c.muon_ns_steps},
                               {"adjust_lr_fn", std::string(choice_name(c.muon_adjust_lr_fn))}});
    }
    test::write_file(dir.path / "cases.json", spec.dump());
    const auto path = dir.path / "torch_muon.safetensors";
    REQUIRE(test::run_python("torch_muon.py",
                             fmt::format("\"{}\" \"{}\"", path.string(), (dir.path / "cases.json").string())) == 0);
    return checkpoint::SafetensorsFile(path);
  }();
  return file;
}

double max_abs_diff(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
}

std::vector<at::Tensor> leaves(const std::vector<at::Tensor>& values) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& v : values) out.push_back(v.clone().requires_grad_(true));
  return out;
}

}  // namespace

TEST_CASE("Muon steps as torch.optim.Muon does, step for step", "[optim][muon][oracle]") {
  const auto& o = oracle();
  std::vector<at::Tensor> initial;
  for (size_t i = 0; i < kShapes.size(); ++i) initial.push_back(o.read(fmt::format("param.{}", i)));
  for (size_t c = 0; c < cases().size(); ++c) {
    const OptimizerConfig& config = cases()[c];
    std::vector<at::Tensor> params = leaves(initial);
    Muon optimizer(params, config);
    for (size_t i = 0; i < params.size(); ++i) REQUIRE(optimizer.is_matrix(i));
    for (int64_t s = 0; s < kSteps; ++s) {
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string key = fmt::format("grad.{}.{}", s, i);
        params[i].mutable_grad() = o.contains(key) ? o.read(key) : at::Tensor();
      }
      optimizer.step(config.lr);
      for (size_t i = 0; i < params.size(); ++i) {
        const double diff = max_abs_diff(params[i].detach(), o.read(fmt::format("case{}.step{}.{}", c, s, i)));
        INFO(fmt::format("case {} step {} matrix {} ({}): max |titan - torch| {:.3g}", c, s + 1, i,
                         fmt::join(kShapes[i], "x"), diff));
        CHECK(diff <= 1e-6);
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const std::vector<ParamState> state = optimizer.state(i);
      REQUIRE(state.size() == 1);
      CHECK(state[0].name == "momentum_buffer");
      CHECK(max_abs_diff(state[0].tensor, o.read(fmt::format("case{}.momentum.{}", c, i))) <= 1e-6);
    }
  }
}

TEST_CASE("newton_schulz returns torch's bf16 bits", "[optim][muon][oracle]") {
  const auto& o = oracle();
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const at::Tensor got = newton_schulz(o.read(fmt::format("grad.0.{}", i)), NewtonSchulz::of(cases()[0]));
    const at::Tensor want = o.read(fmt::format("ns.{}", i));
    INFO(fmt::format("{}: max |diff| {:.3g}", fmt::join(kShapes[i], "x"), max_abs_diff(got, want)));
    CHECK(got.scalar_type() == at::kBFloat16);
    CHECK(at::equal(got.contiguous(), want));
  }
}

TEST_CASE("Muon takes the 2-D hidden matrices and leaves embeddings, head, norms and excluded names to AdamW",
          "[optim][muon]") {
  const std::vector<std::string> names = {"tok_embeddings.weight",           "layers.0.attention.wq.weight",
                                          "layers.0.attention_norm.weight",  "layers.0.moe.experts.w1",
                                          "layers.0.moe.router.gate.weight", "output.weight"};
  std::vector<at::Tensor> params = leaves({at::randn({16, 8}), at::randn({8, 8}), at::ones({8}), at::randn({2, 8, 4}),
                                           at::randn({2, 8}), at::randn({16, 8})});
  OptimizerConfig config{.name = OptimizerName::muon, .muon_exclude = {"router"}};
  const std::vector<bool> routing = muon_matrices(params, names, config, {"tok_embeddings", "output"});
  CHECK(routing == std::vector<bool>{false, true, false, false, false, false});
  const std::unique_ptr<Optimizer> optimizer =
      build_optimizer(params, config, names, {.adamw_modules = {"tok_embeddings", "output"}});
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(names[i]);
    CHECK(optimizer->state(i).front().name == (routing[i] ? "momentum_buffer" : "exp_avg"));
    params[i].mutable_grad() = at::ones_like(params[i]);
  }
  // AdamW moves every weight by ~lr its first step; Muon moves the matrix by lr x its orthogonalised update.
  const std::vector<at::Tensor> before = [&] {
    std::vector<at::Tensor> b;
    for (const at::Tensor& p : params) b.push_back(p.detach().clone());
    return b;
  }();
  optimizer->step(config.lr);
  for (size_t i = 0; i < params.size(); ++i) CHECK_FALSE(at::equal(params[i].detach(), before[i]));
  CHECK(dynamic_cast<Muon&>(*optimizer).orthogonalised_here() == 1);
  // Without Muon, optimizer.name = AdamW builds AdamW over everything.
  CHECK(dynamic_cast<AdamW*>(build_optimizer(params, {}, names).get()) != nullptr);
}

TEST_CASE("a bad Muon config or a routed parameter that is not 2-D is an error naming it", "[optim][muon][config]") {
  JobConfig job;
  apply_override(job, "optimizer.name", "Muon");
  apply_override(job, "optimizer.muon_ns_coefficients", "3,-4.5,2");
  CHECK(job.optimizer.name == OptimizerName::muon);
  CHECK(job.optimizer.muon_ns_coefficients == std::vector<double>{3, -4.5, 2});
  apply_override(job, "optimizer.muon_ns_coefficients", "[3.4445, -4.775, 2.0315]");
  CHECK(job.optimizer.muon_ns_coefficients == OptimizerConfig{}.muon_ns_coefficients);
  CHECK_THAT(test::error_of([&] { apply_override(job, "optimizer.muon_ns_coefficients", "3,x"); }),
             Catch::Contains("optimizer.muon_ns_coefficients expects a list of numbers"));
  const auto error_for = [](const std::function<void(OptimizerConfig&)>& edit) {
    OptimizerConfig config{.name = OptimizerName::muon};
    edit(config);
    std::vector<at::Tensor> params = leaves({at::randn({4, 4})});
    return test::error_of([&] { Muon optimizer(params, config, {"layers.0.wq.weight"}); });
  };
  CHECK_THAT(error_for([](OptimizerConfig& c) { c.muon_ns_steps = 0; }),
             Catch::Contains("expected optimizer.muon_ns_steps in 1 .. 99, got 0"));
  CHECK_THAT(error_for([](OptimizerConfig& c) { c.muon_ns_steps = 100; }),
             Catch::Contains("optimizer.muon_ns_steps in 1 .. 99, got 100"));
  CHECK_THAT(error_for([](OptimizerConfig& c) {
               c.muon_ns_coefficients = {3.4, -4.7};
             }),
             Catch::Contains("optimizer.muon_ns_coefficients to hold three numbers"));
  CHECK_THAT(error_for([](OptimizerConfig& c) { c.muon_momentum = 1.0; }),
             Catch::Contains("optimizer.muon_momentum in [0, 1), got 1.0"));
  CHECK_THAT(error_for([](OptimizerConfig& c) { c.lr = 0; }), Catch::Contains("expected optimizer.lr > 0"));
  CHECK_THAT(error_for([](OptimizerConfig& c) { c.muon_exclude = {"(norm"}; }),
             Catch::Contains("optimizer.muon_exclude") && Catch::Contains("'(norm'"));
  // The validation runs on the whole job too: a config file or flag fails before any model is built.
  job.optimizer.muon_eps = 0;
  CHECK_THAT(test::error_of([&] { validate(job); }), Catch::Contains("expected optimizer.muon_eps > 0"));
  std::vector<at::Tensor> params = leaves({at::randn({4, 4}), at::ones({4})});
  CHECK_THAT(
      test::error_of([&] {
        Muon optimizer(params, {}, {"layers.0.wq.weight", "layers.0.attention_norm.weight"}, {.routing = {true, true}});
      }),
      Catch::Contains("expected a 2-D matrix for each parameter routed to Muon, got "
                      "layers.0.attention_norm.weight of shape (4)"));
}

}  // namespace muon_test
