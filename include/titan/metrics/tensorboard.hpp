// SPDX-License-Identifier: BSD-3-Clause
// TensorBoard event files written by titan: TFRecord framing (length, masked CRC-32C of the length,
// data, masked CRC-32C of the data) around Event protobufs encoded by hand: the file_version event,
// then one event per logged step with a scalar summary per metric. `tensorboard --logdir` and its
// EventAccumulator read them; no protobuf library is involved.
#pragma once

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>
#include <span>
#include <string>

#include "titan/metrics/sink.hpp"

namespace titan {

/// One scalar of a step: `tag` as TensorBoard shows it ("loss_metrics/global_avg_loss").
struct Scalar {
  std::string tag;
  double value = 0;  ///< stored as float32 (the Summary's simple_value), as torch's SummaryWriter does
};

/// torchtitan's folder for a run's event files: <dump_folder>/<save_tb_folder>/<YYYYmmdd-HHMM of
/// `start`, local time>, and /rank_<r> below it when every rank writes (metrics.save_for_all_ranks).
std::filesystem::path tensorboard_folder(const std::filesystem::path& dump_folder, const std::string& save_tb_folder,
                                         std::time_t start, std::optional<int64_t> rank = std::nullopt);

/// One event file, appended a record at a time and flushed after each, so a crash loses at most the
/// record being written.
class TensorBoardWriter final : public MetricsSink {
 public:
  /// Creates `folder` and a new file events.out.tfevents.<unix seconds>.<host>.<pid> in it that
  /// starts with the file_version event. Throws naming the path when it cannot be written.
  explicit TensorBoardWriter(const std::filesystem::path& folder);
  ~TensorBoardWriter() override;
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// Writes one event at `step` holding every scalar, stamped with the current wall time.
  void add_scalars(int64_t step, std::span<const Scalar> scalars);
  /// Every number of `record` but "step" as a scalar of the same name, in one event.
  void write(int64_t step, const nlohmann::json& record) override;
  /// The event file.
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace titan
