// SPDX-License-Identifier: BSD-3-Clause
// WandbWriter and its log framing (metrics/wandb.hpp, metrics/detail/wandb_log.hpp). The wandb_internal
// messages and fields written (wire format in metrics/detail/protobuf_wire.hpp), as the wandb package's
// wandb_internal.proto numbers them:
//   Record        { int64 num = 1; HistoryRecord history = 2; SummaryRecord summary = 3; RunRecord run = 17;
//                   RunExitRecord exit = 18; HeaderRecord header = 21; _RecordInfo _info = 200; }
//   _RecordInfo   { string stream_id = 1; }
//   HeaderRecord  { VersionInfo version_info = 1; }     VersionInfo { string producer = 1; }
//   RunRecord     { string run_id = 1; string entity = 2; string project = 3; ConfigRecord config = 4;
//                   string run_group = 6; string job_type = 7; string display_name = 8; string notes = 9;
//                   repeated string tags = 10; string host = 13; Timestamp start_time = 17; }
//   ConfigRecord  { repeated ConfigItem update = 1; }   ConfigItem { string key = 1; string value_json = 16; }
//   HistoryRecord { repeated HistoryItem item = 1; HistoryStep step = 2; }   HistoryStep { int64 num = 1; }
//   HistoryItem, SummaryItem { repeated string nested_key = 2; string value_json = 16; }
//   SummaryRecord { repeated SummaryItem update = 1; }
//   RunExitRecord { int32 exit_code = 1; int32 runtime = 2; }
//   Timestamp     { int64 seconds = 1; int32 nanos = 2; }
// A metric's name goes in nested_key as one element, as the wandb package writes it: W&B reads '/' as a
// section of the UI, not as nesting.
#include "titan/metrics/wandb.hpp"

#include <fmt/format.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>

#include "host_name.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/metrics/detail/protobuf_wire.hpp"

namespace titan {
namespace detail {
namespace {

enum FragmentType : uint8_t { kFull = 1, kFirst = 2, kMiddle = 3, kLast = 4 };

uint32_t fragment_crc(uint8_t type, std::string_view data) {
  uLong crc = crc32(0L, &type, 1);
  return static_cast<uint32_t>(crc32(crc, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
}

}  // namespace

WandbLog::WandbLog(const std::filesystem::path& path) : path_(path) {
  file_ = std::fopen(path_.c_str(), "wb");
  TITAN_CHECK(file_ != nullptr,
              "[titan::WandbWriter] expected a writable W&B run file, got '{}' opening '{}'. Check job.dump_folder "
              "and metrics.save_tb_folder.",
              std::strerror(errno), path_.string());
  std::string header = ":W&B";
  pb::put_raw(header, static_cast<uint16_t>(0xBEE1));
  header.push_back('\0');  // the format's version
  size_ = 0;
  const bool written = std::fwrite(header.data(), 1, header.size(), file_) == header.size();
  TITAN_CHECK(written && std::fflush(file_) == 0, "[titan::WandbWriter] expected to write '{}', got '{}'.",
              path_.string(), std::strerror(errno));
  size_ = static_cast<int64_t>(header.size());
}

WandbLog::~WandbLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void WandbLog::append(std::string_view record) {
  std::string out;
  out.reserve(record.size() + 2 * kWandbLogHeader);
  int64_t offset = size_ % kWandbLogBlock;
  size_t pos = 0;
  do {
    if (kWandbLogBlock - offset < kWandbLogHeader) {  // no room for a fragment's header: a zero trailer
      out.append(static_cast<size_t>(kWandbLogBlock - offset), '\0');
      offset = 0;
    }
    const size_t n = std::min<size_t>(record.size() - pos, kWandbLogBlock - offset - kWandbLogHeader);
    const bool first = pos == 0;
    const bool last = pos + n == record.size();
    const uint8_t type = first && last ? kFull : first ? kFirst : last ? kLast : kMiddle;
    const std::string_view data = record.substr(pos, n);
    pb::put_raw(out, fragment_crc(type, data));
    pb::put_raw(out, static_cast<uint16_t>(n));
    out.push_back(static_cast<char>(type));
    out.append(data);
    offset += kWandbLogHeader + static_cast<int64_t>(n);
    pos += n;
  } while (pos < record.size());
  const bool written = std::fwrite(out.data(), 1, out.size(), file_) == out.size();
  TITAN_CHECK(written && std::fflush(file_) == 0,
              "[titan::WandbWriter] expected to append {} bytes to '{}', got '{}'. Is the disk full?", out.size(),
              path_.string(), std::strerror(errno));
  size_ += static_cast<int64_t>(out.size());
}

}  // namespace detail

namespace {

using namespace detail::pb;

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string random_run_id() {
  static constexpr std::string_view kChars = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device device;
  std::uniform_int_distribution<size_t> pick(0, kChars.size() - 1);
  std::string id(8, ' ');
  for (char& c : id) c = kChars[pick(device)];
  return id;
}

void check_run(const WandbRun& run) {
  TITAN_CHECK(
      !run.project.empty() && run.project.size() <= 128 && run.project.find_first_of("/\\#?%:") == std::string::npos,
      "[titan::WandbWriter] expected a W&B project of 1 to 128 characters without any of /\\#?%: "
      "(WANDB_PROJECT), got '{}'.",
      run.project);
  const bool spaced = !run.id.empty() && (std::isspace(static_cast<unsigned char>(run.id.front())) != 0 ||
                                          std::isspace(static_cast<unsigned char>(run.id.back())) != 0);
  TITAN_CHECK(!spaced && run.id.find_first_of(":;,#?/'") == std::string::npos,
              "[titan::WandbWriter] expected a W&B run id without any of :;,#?/' and without spaces at its ends "
              "(WANDB_RUN_ID), got '{}'.",
              run.id);
}

// A number as W&B's value_json: JSON, with the NaN and infinities that Python's json writes.
std::string value_json(const nlohmann::json& value) {
  if (value.is_number_float()) {
    const double v = value.get<double>();
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  }
  return value.dump();
}

// A HistoryItem or SummaryItem: the name as one nested_key, the value as JSON.
std::string item(std::string_view name, const std::string& json) {
  std::string out;
  put_bytes(out, 2, name);
  put_bytes(out, 16, json);
  return out;
}

std::string run_record(const WandbRun& run, const nlohmann::json& config, double start_seconds) {
  std::string config_record;
  for (const auto& [key, value] : config.items()) {
    std::string entry;
    put_bytes(entry, 1, key);
    put_bytes(entry, 16, value.dump());
    put_bytes(config_record, 1, entry);
  }
  std::string start_time;
  const double seconds = std::floor(start_seconds);
  put_int(start_time, 1, static_cast<int64_t>(seconds));
  put_int(start_time, 2, std::llround((start_seconds - seconds) * 1e9) % 1000000000);
  std::string out;
  put_bytes(out, 1, run.id);
  if (!run.entity.empty()) put_bytes(out, 2, run.entity);
  put_bytes(out, 3, run.project);
  put_bytes(out, 4, config_record);
  const std::pair<int, const std::string*> optional_strings[] = {
      {6, &run.group}, {7, &run.job_type}, {8, &run.name}, {9, &run.notes}};
  for (const auto& [field, text] : optional_strings) {
    if (!text->empty()) put_bytes(out, field, *text);
  }
  for (const std::string& tag : run.tags) put_bytes(out, 10, tag);
  put_bytes(out, 13, detail::host_name());
  put_bytes(out, 17, start_time);
  return out;
}

// <dir>/wandb/latest-run -> the run's folder, replaced atomically (a symlink renamed over the old one).
void point_latest_run(const std::filesystem::path& folder) {
  const std::filesystem::path link = folder.parent_path() / "latest-run";
  const std::filesystem::path tmp = folder.parent_path() / fmt::format(".latest-run.{}", getpid());
  std::error_code ec;
  std::filesystem::remove(tmp, ec);
  std::filesystem::create_directory_symlink(folder.filename(), tmp, ec);
  if (!ec) std::filesystem::rename(tmp, link, ec);
  if (ec) log::warn("W&B: could not point {} at {}: {}", link.string(), folder.string(), ec.message());
}

}  // namespace

std::optional<WandbRun> wandb_run_from_env(const std::function<std::optional<std::string>(std::string_view)>& env) {
  const std::string mode = env("WANDB_MODE").value_or("");
  static constexpr std::array<std::string_view, 7> kModes = {"",       "online", "offline", "dryrun",
                                                             "shared", "run",    "disabled"};
  TITAN_CHECK(std::find(kModes.begin(), kModes.end(), mode) != kModes.end(),
              "[titan::wandb] expected WANDB_MODE online, offline, dryrun or disabled (or unset), got '{}'. titan "
              "writes W&B runs offline in every mode but disabled; `wandb sync` uploads them.",
              mode);
  if (mode == "disabled") return std::nullopt;
  // The first of `names` that is set and not empty (torchtitan's name first, then the wandb package's).
  const auto first = [&env](std::initializer_list<std::string_view> names) -> std::optional<std::string> {
    for (const std::string_view name : names) {
      if (auto value = env(name); value && !value->empty()) return value;
    }
    return std::nullopt;
  };
  WandbRun run;
  run.project = first({"WANDB_PROJECT"}).value_or(run.project);
  run.entity = first({"WANDB_TEAM", "WANDB_ENTITY"}).value_or("");
  run.id = first({"WANDB_RUN_ID"}).value_or("");
  run.name = first({"WANDB_RUN_NAME", "WANDB_NAME"}).value_or("");
  run.notes = first({"WANDB_RUN_NOTES", "WANDB_NOTES"}).value_or("");
  run.group = first({"WANDB_RUN_GROUP"}).value_or("");
  run.job_type = first({"WANDB_RUN_JOB_TYPE", "WANDB_JOB_TYPE"}).value_or("");
  run.dir = first({"WANDB_DIR"}).value_or("");
  const std::string tags = first({"WANDB_RUN_TAGS", "WANDB_TAGS"}).value_or("");
  for (size_t begin = 0; begin <= tags.size();) {
    const size_t end = std::min(tags.find(',', begin), tags.size());
    std::string tag = tags.substr(begin, end - begin);
    tag.erase(0, tag.find_first_not_of(' '));
    tag.erase(tag.find_last_not_of(' ') + 1);
    if (!tag.empty()) run.tags.push_back(tag);
    begin = end + 1;
  }
  for (const std::string_view ignored : {"WANDB_RESUME_FROM", "WANDB_FORK_FROM"}) {
    if (first({ignored})) log::warn("W&B: {} is not supported by titan's offline runs: ignored", ignored);
  }
  return run;
}

std::optional<WandbRun> wandb_run_from_env() {
  return wandb_run_from_env([](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
  });
}

WandbWriter::WandbWriter(const std::filesystem::path& dir, WandbRun run, const nlohmann::json& config,
                         std::time_t start)
    : run_(std::move(run)), start_seconds_(unix_seconds_now()), uncaught_at_start_(std::uncaught_exceptions()) {
  if (run_.id.empty()) run_.id = random_run_id();
  check_run(run_);
  TITAN_CHECK(config.is_object(), "[titan::WandbWriter] expected the run's config as a JSON object, got {}.",
              config.type_name());
  std::tm local{};
  localtime_r(&start, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d_%H%M%S", &local);
  folder_ = dir / "wandb" / fmt::format("offline-run-{}-{}", stamp, run_.id);
  std::error_code ec;
  for (const char* sub : {"files", "logs"}) std::filesystem::create_directories(folder_ / sub, ec);
  log_ = std::make_unique<detail::WandbLog>(folder_ / fmt::format("run-{}.wandb", run_.id));
  point_latest_run(folder_);
  std::string version;
  put_bytes(version, 1, "titan");
  std::string header;
  put_bytes(header, 1, version);
  append(21, header);
  append(17, run_record(run_, config, start_seconds_));
}

WandbWriter::~WandbWriter() {
  if (finished_) return;
  try {
    finish(std::uncaught_exceptions() > uncaught_at_start_ ? 1 : 0);
  } catch (const std::exception& e) {
    log::warn("W&B: could not finish {}: {}", log_->path().string(), e.what());
  }
}

void WandbWriter::append(int field, const std::string& payload) {
  std::string info;
  put_bytes(info, 1, run_.id);
  std::string record;
  put_int(record, 1, ++records_);
  put_bytes(record, field, payload);
  put_bytes(record, 200, info);
  log_->append(record);
}

void WandbWriter::write(int64_t step, const nlohmann::json& record) {
  TITAN_CHECK(!finished_, "[titan::WandbWriter] expected records before finish(), got one at step {} for '{}'.", step,
              log_->path().string());
  if (row_step_ && *row_step_ != step) write_row();
  if (!row_step_) {
    row_step_ = step;
    row_time_ = unix_seconds_now();
  }
  for (const auto& [key, value] : record.items()) {
    if (key != "step" && value.is_number()) row_[key] = value;
  }
}

void WandbWriter::flush() {
  if (row_step_) write_row();
}

void WandbWriter::write_row() {
  // The wandb package's row: the metrics, the step as _step, the wall time as _timestamp (unix seconds) and
  // the time since the start as _runtime; the summary update repeats the row (the run's latest values).
  nlohmann::json row = row_;
  row["_step"] = *row_step_;
  row["_timestamp"] = row_time_;
  row["_runtime"] = row_time_ - start_seconds_;
  std::string items;
  for (const auto& [key, value] : row.items()) put_bytes(items, 1, item(key, value_json(value)));
  std::string step;
  put_int(step, 1, *row_step_);
  std::string history = items;
  put_bytes(history, 2, step);
  append(2, history);
  append(3, items);  // SummaryRecord.update = 1, as HistoryRecord.item = 1: the same encoded items
  row_step_.reset();
  row_ = nlohmann::json::object();
}

void WandbWriter::finish(int exit_code) {
  TITAN_CHECK(!finished_, "[titan::WandbWriter] expected one finish() per run, got a second for '{}'.",
              log_->path().string());
  flush();
  finished_ = true;
  std::string exit;
  put_int(exit, 1, exit_code);
  put_int(exit, 2, std::llround(unix_seconds_now() - start_seconds_));
  append(18, exit);
}

}  // namespace titan
