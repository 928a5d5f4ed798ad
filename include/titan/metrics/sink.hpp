// SPDX-License-Identifier: BSD-3-Clause
// Where logged records go. MetricsProcessor builds one record per log and per validation result (the JSONL
// line's object: "step" and every metric by its torchtitan name) and hands it to each sink: metrics.jsonl,
// TensorBoard's event file (metrics/tensorboard.hpp), a W&B run (metrics/wandb.hpp), or a user's own.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>

namespace titan {

/// One destination of the logged records.
class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  /// One record at `step`: an object of metric name -> number (integers stay integers), "step" included.
  /// Several records may share a step (a training log and a validation result).
  virtual void write(int64_t step, const nlohmann::json& record) = 0;
  /// The records of every step so far are complete (the next step began): a sink that gathers a step's
  /// records into one row writes it now.
  virtual void flush() {}
};

/// metrics.jsonl: one JSON object per line, appended and flushed per record.
class JsonlWriter final : public MetricsSink {
 public:
  /// Opens `path` for appending (a resumed run adds its lines). Throws naming the path when it cannot.
  explicit JsonlWriter(const std::filesystem::path& path);
  void write(int64_t step, const nlohmann::json& record) override;

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace titan
