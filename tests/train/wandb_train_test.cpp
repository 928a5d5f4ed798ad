// SPDX-License-Identifier: BSD-3-Clause
// The trainer's W&B run (metrics.enable_wandb, WANDB_MODE=offline), read by the wandb package's own reader
// (tests/oracles/wandb_run.py): every value of metrics.jsonl at its step, validation included, one row per
// step, the job config equal to config.json, W&B's variables honoured, and `wandb sync` ready to upload it.
#include <fmt/format.h>
#include <stdlib.h>

#include <optional>
#include <string>

#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

namespace fs = std::filesystem;

namespace {

// Sets (or, given nullptr, unsets) an environment variable for a scope (this test's process only), restoring it
// after.
class WandbScopedEnv {
 public:
  WandbScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, /*overwrite=*/1);
    } else {
      unsetenv(name);
    }
  }
  ~WandbScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  WandbScopedEnv(const WandbScopedEnv&) = delete;
  WandbScopedEnv& operator=(const WandbScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_{};
};

}  // namespace

TEST_CASE("W&B: the wandb package reads every value of metrics.jsonl at every logged step, and the config",
          "[train][wandb]") {
  const WandbScopedEnv mode("WANDB_MODE", "offline");
  const WandbScopedEnv project("WANDB_PROJECT", "titan-test");
  const WandbScopedEnv tags("WANDB_RUN_TAGS", "tinyshakespeare,debugmodel");
  const WandbScopedEnv no_dir("WANDB_DIR", nullptr);  // the run goes where torchtitan puts it
  titan::test::TempDir dir;
  titan::JobConfig c = titan::test::metrics_sink_job(dir.path);  // logs steps 1, 2, 4, 5
  c.metrics.enable_wandb = true;
  {
    titan::Trainer<titan::llama3::Llama3> trainer(c);
    trainer.train();
  }
  // torchtitan's place, wandb.init(dir=<dump>/board/<YYYYmmdd-HHMM>): <that>/wandb/offline-run-<time>-<id>/.
  const fs::path stamp = titan::test::only_entry(dir.path / "board");
  const fs::path wandb_run = titan::test::only_entry(stamp / "wandb", "offline-run-");
  CHECK_FALSE(fs::exists(stamp / "rank_0"));
  // Logged steps 1, 2, 4, 5 with validation at 2 and 4: 24 keys (training, memory, validation).
  REQUIRE(titan::test::run_python(
              "wandb_run.py", fmt::format("run \"{}\" \"{}\" --config=\"{}\" --min-steps=4 --min-keys=24 --exit-code=0 "
                                          "--project=titan-test --tags=tinyshakespeare,debugmodel",
                                          wandb_run.string(), (dir.path / "metrics.jsonl").string(),
                                          (dir.path / "config.json").string())) == 0);
}
