// SPDX-License-Identifier: BSD-3-Clause
// Weights & Biases runs written by titan, in W&B's offline format, so no Python runs beside training and no
// network is needed: <dir>/wandb/offline-run-<YYYYmmdd_HHMMSS>-<id>/run-<id>.wandb, the run's transaction
// log, which `wandb sync` uploads (after the run, or while it trains with `wandb beta sync --live`). The log
// is W&B's LevelDB-style framing (32 KiB blocks of records, each with an IEEE CRC-32 of its type and data)
// around hand-encoded `wandb_internal.Record` protobufs: a header, the run (project, id, name, tags, the
// job config), one history row and one summary update per logged step, and the exit code at the end.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <ctime>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "titan/metrics/detail/wandb_log.hpp"
#include "titan/metrics/sink.hpp"

namespace titan {

/// A run as torchtitan's WandBLogger starts it: wandb.init's arguments, which it reads from W&B's variables
/// (see wandb_run_from_env).
struct WandbRun {
  std::string project = "torchtitan";  ///< WANDB_PROJECT (torchtitan's default)
  std::string entity{};                ///< WANDB_TEAM or WANDB_ENTITY; empty: the uploader's default entity
  std::string id{};                    ///< WANDB_RUN_ID; empty: 8 random characters of [a-z0-9]
  std::string name{};                  ///< WANDB_RUN_NAME or WANDB_NAME; empty: W&B names it
  std::string notes{};                 ///< WANDB_RUN_NOTES or WANDB_NOTES
  std::vector<std::string> tags{};     ///< WANDB_RUN_TAGS or WANDB_TAGS, comma-separated
  std::string group{};                 ///< WANDB_RUN_GROUP
  std::string job_type{};              ///< WANDB_RUN_JOB_TYPE or WANDB_JOB_TYPE
  std::string dir{};                   ///< WANDB_DIR, the folder holding wandb/; empty: the trainer's choice
};

/// The run W&B's variables describe, read through `env` (a name's value, or nullopt when unset), or nullopt
/// when WANDB_MODE is "disabled". WANDB_MODE may be unset, online, offline, dryrun or disabled: titan always
/// writes offline (upload with `wandb sync`); any other value throws naming WANDB_MODE.
std::optional<WandbRun> wandb_run_from_env(const std::function<std::optional<std::string>(std::string_view)>& env);
/// wandb_run_from_env over the process environment.
std::optional<WandbRun> wandb_run_from_env();

/// A W&B run's transaction log, fed with the logged records (a MetricsSink). The records of one step become
/// one history row (as wandb.log(..., step=s) merges them), written with its summary update when a later
/// step arrives, at flush() or at finish(); each write is flushed to the file, so a crash loses at most the
/// step in flight, and `wandb sync` marks a run without an exit record as failed.
class WandbWriter final : public MetricsSink {
 public:
  /// Creates <dir>/wandb/offline-run-<YYYYmmdd_HHMMSS of `start`, local time>-<id>/ with files/ and logs/
  /// (as the wandb package lays it out), points <dir>/wandb/latest-run at it, and starts run-<id>.wandb with
  /// the header and the run record holding `config` (an object; each top-level key a config entry). A run
  /// without an id gets a random one. Throws naming the path when it cannot be written.
  WandbWriter(const std::filesystem::path& dir, WandbRun run, const nlohmann::json& config,
              std::time_t start = std::time(nullptr));
  /// finish(1) while an exception unwinds the stack (one thrown since construction), finish(0) otherwise;
  /// never throws.
  ~WandbWriter() override;
  WandbWriter(const WandbWriter&) = delete;
  WandbWriter& operator=(const WandbWriter&) = delete;

  void write(int64_t step, const nlohmann::json& record) override;
  void flush() override;
  /// Writes the held row and the exit record (`exit_code`, the runtime in seconds); nothing may be written
  /// after it.
  void finish(int exit_code);

  const WandbRun& run() const { return run_; }
  /// The run's folder, what `wandb sync` takes.
  const std::filesystem::path& folder() const { return folder_; }
  /// The transaction log, run-<id>.wandb.
  const std::filesystem::path& path() const { return log_->path(); }

 private:
  void append(int field, const std::string& payload);  // a Record holding `payload` as its field `field`
  void write_row();

  WandbRun run_;
  std::filesystem::path folder_;
  std::unique_ptr<detail::WandbLog> log_;
  int64_t records_ = 0;       // Record.num of the last record
  double start_seconds_ = 0;  // unix time of the start, for the rows' _runtime
  int uncaught_at_start_ = 0;
  std::optional<int64_t> row_step_{};  // the held row: its step, its values and the time of its first record
  nlohmann::json row_ = nlohmann::json::object();
  double row_time_ = 0;
  bool finished_ = false;
};

}  // namespace titan
