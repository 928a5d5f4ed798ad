// SPDX-License-Identifier: BSD-3-Clause
// The profiler: torchtitan's schedule, and ranks as threads of one process (Kineto is one session per
// process: one rank holds it, the other records with titan's thread-local recorder), each rank's trace
// Chrome-trace JSON with aten::mm and its FSDP ranges in order (tests/oracles/profile_trace.py), and TP
// ranks' traces hold their TP collectives.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dist/rank_test_util.hpp"
#include "parallel/parity_util.hpp"
#include "test_util.hpp"
#include "titan/core/profile_scope.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/metrics/profiler.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/loss.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"

using namespace titan;
namespace fs = std::filesystem;

TEST_CASE("Profiler: torchtitan's schedule waits then warms up then records up to each multiple of profile_freq",
          "[metrics][profiler]") {
  // One letter per step: idle, warmup, active.
  auto schedule = [](int64_t steps, int64_t freq, int64_t warmup, int64_t active) {
    std::string letters;
    for (int64_t step = 1; step <= steps; ++step) {
      const ProfilerPhase phase = profiler_phase(step, freq, warmup, active);
      letters += phase == ProfilerPhase::idle ? 'i' : phase == ProfilerPhase::warmup ? 'w' : 'a';
    }
    return letters;
  };
  // profile_freq 10, warmup 3, active 1 (the defaults): steps 7-9 warm up, step 10 records.
  CHECK(schedule(20, 10, 3, 1) == "iiiiiiwwwaiiiiiiwwwa");
  // No wait (freq == warmup + active); two active steps.
  CHECK(schedule(6, 3, 1, 2) == "waawaa");
  CHECK(schedule(4, 2, 0, 1) == "iaia");
  CHECK_THROWS_WITH(profiler_phase(1, 3, 3, 1), Catch::Contains("profile_freq >= profiler_warmup + profiler_active"));
}

TEST_CASE("Profiler: 2 FSDP ranks as threads each write a Chrome trace with aten::mm and FSDP ranges in order",
          "[metrics][profiler][fsdp]") {
  test::TempDir dump;
  std::mutex mutex;
  std::vector<std::optional<fs::path>> traces(2);
  std::set<ProfilerBackend> backends;
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 2}, rank, store, test::mesh_options());
    nn::manual_init_seed(42);
    llama3::Llama3 model(test::parity_args(), 32, at::TensorOptions());
    const Parallelized parallel = parallelize(model, mesh, parallel::plan(model.sharding_spec(), {}, mesh.shape()));
    model.init_weights();
    const at::Tensor tokens = at::randint(512, {1, 32}, at::kLong);  // (B, S)
    // Steps 1-2: step 1 warms up, step 2 records and is saved as iteration_2.
    Profiler profiler({.folder = dump.path / "profile_traces", .rank = rank, .freq = 2, .warmup = 1, .active = 1});
    std::optional<fs::path> saved;
    for (int64_t step = 1; step <= 2; ++step) {
      profiler.begin_step(step);
      at::Tensor loss;
      {
        const ProfileScope forward("titan::forward");
        loss = cross_entropy_sum(model.forward(tokens), tokens);
      }
      loss.backward();
      if (auto path = profiler.end_step(step)) saved = path;
    }
    std::lock_guard lock(mutex);
    traces[static_cast<size_t>(rank)] = saved;
    backends.insert(profiler.backend());
  });
  for (int64_t rank = 0; rank < 2; ++rank) {
    const auto& path = traces[static_cast<size_t>(rank)];
    REQUIRE(path.has_value());
    CHECK(*path == dump.path / "profile_traces" / "iteration_2" / fmt::format("rank{}_trace.json", rank));
    CHECK(titan::test::run_python(
              "profile_trace.py",
              fmt::format("--require ProfilerStep#2 --require \"FSDP::reduce_scatter \" \"{}\"", path->string())) == 0);
  }
  // One rank held Kineto, the other used the thread-local recorder.
  CHECK(backends.size() == 2);
  CHECK(backends.count(ProfilerBackend::kineto) == 1);
  CHECK(backends.count(ProfilerBackend::thread_local_recorder) == 1);
}

TEST_CASE("Profiler: 2 TP ranks as threads record their TP collectives", "[metrics][profiler][tp]") {
  test::TempDir dump;
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.tp = 2}, rank, store, test::mesh_options());
    nn::manual_init_seed(42);
    llama3::Llama3 model(test::parity_args(), 32, at::TensorOptions());
    const Parallelized parallel = parallelize(model, mesh, parallel::plan(model.sharding_spec(), {}, mesh.shape()));
    model.init_weights();
    const at::Tensor tokens = at::randint(512, {2, 32}, at::kLong);  // (B, S), the same on both ranks
    Profiler profiler({.folder = dump.path / "traces", .rank = rank, .freq = 1, .warmup = 0, .active = 1});
    profiler.begin_step(1);
    parallel.cross_entropy_sum(model.forward(tokens), tokens).backward();
    RANK_CHECK(profiler.end_step(1).has_value());
  });
  for (int64_t rank = 0; rank < 2; ++rank) {
    const nlohmann::json trace = nlohmann::json::parse(
        test::read_file(dump.path / "traces" / "iteration_1" / fmt::format("rank{}_trace.json", rank)));
    std::set<std::string> names;
    for (const auto& e : trace.at("traceEvents")) {
      if (e.value("ph", "") == "X") names.insert(e.at("name").get<std::string>());
    }
    INFO("rank " << rank);
    CHECK(names.count("aten::mm") == 1);
    CHECK(names.count("ProfilerStep#1") == 1);
    // The llama3 plan: sequence parallel norms (all-gather into colwise, reduce-scatter out of rowwise).
    CHECK(names.count("TP::all_gather") == 1);
    CHECK(names.count("TP::reduce_scatter") == 1);
  }
}
