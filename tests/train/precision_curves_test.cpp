// SPDX-License-Identifier: BSD-3-Clause
// The committed loss curves of docs/assets/precision_curves.csv (written by scripts/precision_curves.py:
// the debug model, 200 steps, in fp32, bf16 mixed precision and float8 tensorwise / rowwise /
// rowwise_with_gw_hp) against what docs/mixed_precision.md claims about them, and their first steps
// against a fresh run of the same job through the trainer.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

namespace {

constexpr int64_t kCurveSteps = 200;

/// mode -> max |loss - fp32| over the 200 steps as docs/mixed_precision.md states it (4 decimals).
const std::map<std::string, double> kClaimedDistance = {
    {"bf16", 0.0012}, {"float8_tensorwise", 0.0062}, {"float8_rowwise", 0.0056}, {"float8_rowwise_with_gw_hp", 0.0048}};

/// Column name -> losses of steps 1..N.
std::map<std::string, std::vector<double>> read_curves(const std::filesystem::path& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::string line;
  REQUIRE(std::getline(in, line));
  std::vector<std::string> names;
  {
    std::stringstream ss(line);
    for (std::string name; std::getline(ss, name, ',');) names.push_back(name);
  }
  REQUIRE(names.size() == 6);
  REQUIRE(names[0] == "step");
  std::map<std::string, std::vector<double>> curves;
  for (int64_t step = 1; std::getline(in, line); ++step) {
    std::stringstream ss(line);
    std::string cell;
    REQUIRE(std::getline(ss, cell, ','));
    REQUIRE(std::stoll(cell) == step);
    for (size_t c = 1; c < names.size(); ++c) {
      REQUIRE(std::getline(ss, cell, ','));
      curves[names[c]].push_back(std::stod(cell));
    }
  }
  return curves;
}

double max_distance(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

/// scripts/precision_curves.py's job: short_precision_job over a 200-step schedule, cut after `steps`.
titan::JobConfig curve_job(const std::filesystem::path& dump, const std::string& mode, int64_t steps) {
  titan::JobConfig c = titan::test::short_precision_job(dump, steps);
  c.lr_scheduler.total_steps = kCurveSteps;  // the same learning rates as the 200-step run's first steps
  if (mode == "bf16") c.training.mixed_precision_param = titan::DType::bfloat16;
  if (mode.rfind("float8_", 0) == 0) {
    c.model.converters = {"float8"};
    c.float8.recipe_name = titan::parse_choice<titan::Float8Recipe>(mode.substr(7));
    REQUIRE(c.float8.recipe_name.has_value());
    c.float8.filter_fqns = {"output"};
  }
  return c;
}

}  // namespace

TEST_CASE("precision curves: the committed 200-step curves hold docs/mixed_precision.md's distances from fp32",
          "[train][mixed_precision][float8][curves]") {
  const auto curves = read_curves(titan::test::source_dir() / "docs" / "assets" / "precision_curves.csv");
  const std::vector<double>& fp32 = curves.at("fp32");
  REQUIRE(static_cast<int64_t>(fp32.size()) == kCurveSteps);
  for (const auto& [mode, claim] : kClaimedDistance) {
    INFO(mode);
    const std::vector<double>& curve = curves.at(mode);
    REQUIRE(curve.size() == fp32.size());
    const double d = max_distance(curve, fp32);
    WARN(mode << " vs fp32, max |loss difference| over " << kCurveSteps << " steps: " << d);
    CHECK(std::abs(d - claim) < 1e-4);
    CHECK(d > 0);                               // a different program from fp32
    CHECK(curve.back() < curve.front() - 2.0);  // and it learned
  }
}

TEST_CASE("precision curves: a fresh run reproduces the committed curves' first steps in every mode",
          "[train][mixed_precision][float8][curves][full]") {
  const auto curves = read_curves(titan::test::source_dir() / "docs" / "assets" / "precision_curves.csv");
  titan::test::TempDir dir;
  // Steps per mode: few for bf16, whose GEMMs are 40-140x slower than fp32 on CPUs without bf16 dot
  // products (docs/mixed_precision.md).
  const std::vector<std::pair<std::string, int64_t>> runs = {
      {"fp32", 10}, {"float8_tensorwise", 6}, {"float8_rowwise", 4}, {"float8_rowwise_with_gw_hp", 4}, {"bf16", 2}};
  std::vector<double> fresh_fp32;  // fp32 runs first
  for (const auto& [mode, steps] : runs) {
    INFO(mode);
    titan::Trainer<titan::llama3::Llama3> trainer(curve_job(dir.path / mode, mode, steps));
    trainer.train();
    const std::vector<double> fresh = trainer.core().loss_history();
    REQUIRE(static_cast<int64_t>(fresh.size()) == steps);
    const std::vector<double>& committed = curves.at(mode);
    // The same job reproduces bit for bit on one CPU kind (the CSV keeps 6 decimals). Another ISA's fp32
    // GEMMs round differently (~1e-7 relative), which moves fp32's early losses by ~1e-6. In bf16 and float8
    // the same difference flips an element to the next bf16 or float8 value wherever it lies near a rounding
    // boundary, which moves these losses by up to 2.1e-4 (measured: a curve written on an AVX2 AMD EPYC,
    // rerun on an AVX-512 Intel Xeon; 3.2e-4 at float8 tensorwise's step 6 on an AVX-512 AMD EPYC, Zen 4,
    // whose loss gradients also came from the fused cross-entropy, a few fp32 ulps from ATen's).
    // Which elements flip depends on the CPU, but how far the mode moves the loss is its own quantisation
    // effect: its distance from fp32 at that step (1.7e-3 for tensorwise at step 6). So fp32 is held to 5e-5
    // and the low-precision modes to 3e-4 or a quarter of their committed distance from fp32, whichever is
    // larger, and each mode is also told apart from a fresh fp32 run below.
    for (size_t i = 0; i < fresh.size(); ++i) {
      const double own_effect = std::abs(committed[i] - curves.at("fp32")[i]);
      const double tolerance = mode == "fp32" ? 5e-5 : std::max(3e-4, 0.25 * own_effect);
      INFO("step " << i + 1 << ": fresh " << fresh[i] << " committed " << committed[i] << " tolerance " << tolerance);
      CHECK(std::abs(fresh[i] - committed[i]) < tolerance);
    }
    if (mode == "fp32") fresh_fp32 = fresh;
    // Told apart from fp32 on the same CPU, where fp32 reproduces bit for bit: a run that silently fell back
    // to fp32 fails here. (The low-precision modes' first steps lie within the ISA spread of each other;
    // scripts/precision_curves.py reruns all 200 steps of every mode.)
    if (mode != "fp32") CHECK(max_distance(fresh, fresh_fp32) > 5e-5);
  }
}

// The slow tier (`ctest -L slow`): every mode's whole 200-step curve again, and bf16 optimizer states
// (`--optimizer.implementation fused_opt_states_bf16`) beside fp32 states over the same 200 steps.
TEST_CASE(
    "precision curves: a fresh run reproduces every committed 200-step curve, and bf16 optimizer states "
    "track fp32 states",
    "[train][mixed_precision][float8][curves][slow]") {
  const auto curves = read_curves(titan::test::source_dir() / "docs" / "assets" / "precision_curves.csv");
  titan::test::TempDir dir;
  auto run = [&](const std::string& mode, titan::OptimizerImplementation implementation) {
    titan::JobConfig job =
        curve_job(dir.path / (mode + "_" + std::string(titan::choice_name(implementation))), mode, kCurveSteps);
    job.optimizer.implementation = implementation;
    titan::Trainer<titan::llama3::Llama3> trainer(std::move(job));
    trainer.train();
    std::vector<double> losses = trainer.core().loss_history();
    REQUIRE(static_cast<int64_t>(losses.size()) == kCurveSteps);
    return losses;
  };
  // fp32 reproduces across CPUs to reordering: 1.4e-6 over the 200 steps between the committed curve (an
  // AVX2 AMD EPYC) and an AVX-512 Intel Xeon (2026-12-03), held to 1e-4. In bf16 and float8 that
  // difference flips elements to the next representable value and the runs' weights drift apart: measured
  // 0.0011 (bf16), 0.0055 (float8 tensorwise), 0.0031 (rowwise), 0.0022 (rowwise_with_gw_hp) between the
  // same two CPUs, held to 0.01, well under the 2+ nats each curve falls. What must hold on every CPU is the
  // claim docs/mixed_precision.md makes: each mode's distance from fp32 run on the same CPU, within a factor
  // of 2 of the distance the committed curves show (the exact distance is CPU-specific, as above).
  std::map<std::string, std::vector<double>> fresh;
  for (const std::string mode : {"fp32", "bf16", "float8_tensorwise", "float8_rowwise", "float8_rowwise_with_gw_hp"}) {
    INFO(mode);
    fresh[mode] = run(mode, titan::OptimizerImplementation::fused);
    const double d = max_distance(fresh[mode], curves.at(mode));
    WARN(mode << ": fresh 200-step run vs committed curve, max |loss difference|: " << d);
    CHECK(d < (mode == "fp32" ? 1e-4 : 0.01));
    CHECK(fresh[mode].back() < fresh[mode].front() - 2.0);
    if (mode == "fp32") continue;
    const double from_fp32 = max_distance(fresh[mode], fresh["fp32"]);
    WARN(mode << ": fresh run vs fresh fp32, max |loss difference|: " << from_fp32
              << " (committed curves: " << kClaimedDistance.at(mode) << ")");
    CHECK(from_fp32 > kClaimedDistance.at(mode) / 2);
    CHECK(from_fp32 < kClaimedDistance.at(mode) * 2);
  }
  // bf16 moments round exp_avg and exp_avg_sq to 8 bits of mantissa each step (2^-9 relative), which moves
  // the update m / sqrt(v) by ~2^-9 relative: measured 1.1e-4 over the 200 steps (2026-12-03, Intel Xeon
  // AVX512-BF16), a tenth of what bf16 autocast moves the loss. Held to 5e-4.
  const std::vector<double> bf16_states = run("fp32", titan::OptimizerImplementation::fused_opt_states_bf16);
  const double d = max_distance(bf16_states, fresh["fp32"]);
  WARN("fused_opt_states_bf16 vs fp32 states, max |loss difference| over " << kCurveSteps << " steps: " << d);
  CHECK(d > 0);  // the states really were bf16
  CHECK(d < 5e-4);
  CHECK(bf16_states.back() < bf16_states.front() - 2.0);
}
