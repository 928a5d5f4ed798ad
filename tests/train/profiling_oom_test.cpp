// SPDX-License-Identifier: BSD-3-Clause
// A step that runs out of memory (the test fault oom) writes torchtitan's exit snapshot,
// memory_snapshot/iteration_<step-1>_exit/rank0_memory_snapshot.json, and the rethrown
// c10::OutOfMemoryError names it; without profiling.enable_memory_snapshot the error says how to get one.
#include <nlohmann/json.hpp>

#include <algorithm>

#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/core/test_faults.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

namespace fs = std::filesystem;

namespace {

// The error message of training `config` with step 2 failing as out of memory (empty: no such error).
std::string train_with_oom_at_step_2(titan::JobConfig config) {
  const titan::testing::Faults before = titan::testing::set_faults({.oom_step = 2});
  titan::Trainer<titan::llama3::Llama3> trainer(std::move(config));  // reads the faults once, here
  titan::testing::set_faults(before);
  try {
    trainer.train();
  } catch (const c10::OutOfMemoryError& e) {
    CHECK(trainer.core().step() == 1);  // the last completed step: step 2 failed
    return e.what_without_backtrace();
  }
  return {};
}

}  // namespace

TEST_CASE("Memory snapshot: an out-of-memory step writes the exit snapshot and the error names it",
          "[train][profiler][memory]") {
  titan::test::TempDir dump;
  titan::JobConfig c = titan::test::tinyshakespeare_job(dump.path, /*seq_len=*/32, /*local_batch=*/2, /*steps=*/3,
                                                        /*seed=*/42);
  c.profiling.enable_memory_snapshot = true;
  const std::string message = train_with_oom_at_step_2(c);
  const fs::path snapshot = dump.path / "memory_snapshot" / "iteration_1_exit" / "rank0_memory_snapshot.json";
  CHECK_THAT(message, Catch::Contains("out of memory at step 2"));
  CHECK_THAT(message, Catch::Contains("test fault oom: simulated out of memory at step 2"));
  CHECK_THAT(message, Catch::Contains(snapshot.string()));
  REQUIRE(fs::exists(snapshot));
  CHECK(titan::test::run_python("memory_timeline.py", "\"" + snapshot.string() + "\"") == 0);
  // The failing step's activations are in the snapshot: its running total rose above the total where step 2
  // began (by the unwinding the exception did, they are freed again at the last event).
  const nlohmann::json timeline = nlohmann::json::parse(titan::test::read_file(snapshot));
  CHECK(timeline.at("format") == "titan.memory_timeline");
  const auto& events = timeline.at("events");
  REQUIRE_FALSE(events.empty());
  int64_t step2_start = -1;
  for (const auto& s : timeline.at("steps")) {
    if (s.at("step") == 2) step2_start = s.at("event").get<int64_t>();
  }
  REQUIRE(step2_start >= 0);
  const int64_t total_at_start = step2_start == 0 ? timeline.at("base_total_bytes").get<int64_t>()
                                                  : events.at(step2_start - 1).at(3).get<int64_t>();
  int64_t step2_peak = total_at_start;
  int64_t step2_activation_bytes = 0;  // allocated in step 2, category activations (3)
  for (size_t i = static_cast<size_t>(step2_start); i < events.size(); ++i) {
    step2_peak = std::max(step2_peak, events[i].at(3).get<int64_t>());
    if (events[i].at(2) == 3 && events[i].at(1).get<int64_t>() > 0)
      step2_activation_bytes += events[i].at(1).get<int64_t>();
  }
  INFO("total bytes where step 2 began " << total_at_start << ", its peak " << step2_peak << ", activations "
                                         << step2_activation_bytes);
  CHECK(step2_peak > total_at_start);
  CHECK(step2_activation_bytes > 0);

  titan::test::TempDir plain;
  titan::JobConfig off = c;
  off.job.dump_folder = plain.path.string();
  off.profiling.enable_memory_snapshot = false;
  const std::string hint = train_with_oom_at_step_2(off);
  CHECK_THAT(hint, Catch::Contains("turn on profiling.enable_memory_snapshot"));
  CHECK_FALSE(fs::exists(plain.path / "memory_snapshot"));
}
