// SPDX-License-Identifier: BSD-3-Clause
// A step that runs out of memory (the TITAN_TEST_OOM_AT_STEP hook) writes torchtitan's exit snapshot,
// memory_snapshot/iteration_<step-1>_exit/rank0_memory_snapshot.json, and the rethrown
// c10::OutOfMemoryError names it; without profiling.enable_memory_snapshot the error says how to get one.
#include <cstdlib>

#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

namespace fs = std::filesystem;

namespace {

// The error message of training `config` with step 2 failing as out of memory (empty: no such error).
std::string train_with_oom_at_step_2(titan::JobConfig config) {
  setenv("TITAN_TEST_OOM_AT_STEP", "2", 1);
  titan::Trainer<titan::llama3::Llama3> trainer(std::move(config));
  unsetenv("TITAN_TEST_OOM_AT_STEP");
  try {
    trainer.train();
  } catch (const c10::OutOfMemoryError& e) {
    CHECK(trainer.core().step() == 2);
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
  CHECK_THAT(message, Catch::Contains("TITAN_TEST_OOM_AT_STEP: simulated out of memory at step 2"));
  CHECK_THAT(message, Catch::Contains(snapshot.string()));
  REQUIRE(fs::exists(snapshot));
  CHECK(titan::test::run_python("memory_timeline.py", "\"" + snapshot.string() + "\"") == 0);
  // The failing step's activations were alive when it failed: the timeline's last total is above its base.
  const std::string json = titan::test::read_file(snapshot);
  CHECK_THAT(json, Catch::Contains("\"format\":\"titan.memory_timeline\""));

  titan::test::TempDir plain;
  titan::JobConfig off = c;
  off.job.dump_folder = plain.path.string();
  off.profiling.enable_memory_snapshot = false;
  const std::string hint = train_with_oom_at_step_2(off);
  CHECK_THAT(hint, Catch::Contains("turn on profiling.enable_memory_snapshot"));
  CHECK_FALSE(fs::exists(plain.path / "memory_snapshot"));
}
