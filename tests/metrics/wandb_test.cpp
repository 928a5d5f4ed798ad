// SPDX-License-Identifier: BSD-3-Clause
// W&B runs written by titan, read by the wandb package's own reader (tests/oracles/wandb_run.py, which runs
// `wandb leet inspect`): the log framing on every block-boundary case, a run's rows, summary, config and
// exit code, a run read while it is written (a crash), a corrupted file refused, and W&B's variables. A
// trainer's run against its metrics.jsonl is tests/train/wandb_train_test.cpp.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <stdexcept>

#include "test_util.hpp"
#include "titan/metrics/detail/protobuf_wire.hpp"
#include "titan/metrics/detail/wandb_log.hpp"
#include "titan/metrics/wandb.hpp"

namespace fs = std::filesystem;
namespace pb = titan::detail::pb;
using titan::detail::kWandbLogBlock;
using titan::detail::kWandbLogHeader;

namespace {

// A Record { num, history { item { nested_key "pad", value_json "xx...x" (as a JSON string) }, step } }.
std::string wandb_history_record(int64_t num, size_t pad) {
  std::string item;
  pb::put_bytes(item, 2, "pad");
  pb::put_bytes(item, 16, "\"" + std::string(pad, 'x') + "\"");
  std::string step;
  pb::put_int(step, 1, num);
  std::string history;
  pb::put_bytes(history, 1, item);
  pb::put_bytes(history, 2, step);
  std::string record;
  pb::put_int(record, 1, num);
  pb::put_bytes(record, 2, history);
  return record;
}

// The pad that makes wandb_history_record(num, pad) exactly `bytes` long (300 to 16000 bytes: every length prefix
// takes two bytes there, so each pad character adds one byte).
size_t wandb_pad_for(int64_t num, int64_t bytes) {
  REQUIRE(bytes >= 300);
  REQUIRE(bytes <= 16000);
  const auto base = static_cast<int64_t>(wandb_history_record(num, 200).size()) - 200;
  const auto pad = static_cast<size_t>(bytes - base);
  REQUIRE(static_cast<int64_t>(wandb_history_record(num, pad).size()) == bytes);
  return pad;
}

int run_wandb_oracle(const std::string& args) { return titan::test::run_python("wandb_run.py", args); }

void write_wandb_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

nlohmann::json wandb_record(int64_t step, nlohmann::json values) {
  values["step"] = step;
  return values;
}

}  // namespace

TEST_CASE("W&B log framing: trailers of 0 to 8 bytes, FIRST MIDDLE LAST fragments, read by the wandb package",
          "[metrics][wandb]") {
  titan::test::TempDir dir;
  const fs::path path = dir.path / "run-framing.wandb";
  nlohmann::json expected = nlohmann::json::array();
  {
    titan::detail::WandbLog log(path);
    CHECK(log.size() == kWandbLogHeader);  // ":W&B", 0xBEE1, version 0
    std::string header_record;
    std::string header;
    pb::put_bytes(header, 1, std::string("\x0a\x05titan", 7));  // version_info { producer "titan" }
    pb::put_int(header_record, 1, 1);
    pb::put_bytes(header_record, 21, header);
    log.append(header_record);
    int64_t num = 1;
    const auto append = [&](size_t pad) {
      log.append(wandb_history_record(++num, pad));
      expected.push_back({{"num", num}, {"pad", pad}});
    };
    // For each r, end a record exactly r bytes before a block's end: r < 7 leaves a zero trailer, 7 a header
    // with no data (an empty FIRST fragment), 8 one byte of data; the next record starts after it.
    for (int64_t r = 0; r <= 8; ++r) {
      const auto left = [&] { return kWandbLogBlock - log.size() % kWandbLogBlock; };
      while (left() - kWandbLogHeader - r < 300 || left() - kWandbLogHeader - r > 16000) append(5000);
      append(wandb_pad_for(num + 1, left() - kWandbLogHeader - r));
      CHECK((log.size() + r) % kWandbLogBlock == 0);
      append(500);
    }
    append(70000);  // FIRST, MIDDLE, LAST across three blocks
    append(10);
    CHECK(log.size() > 3 * kWandbLogBlock);
  }
  write_wandb_text(dir.path / "expected.json", expected.dump());
  REQUIRE(run_wandb_oracle(
              fmt::format("records \"{}\" \"{}\"", path.string(), (dir.path / "expected.json").string())) == 0);

  // A flipped byte in a record's data fails its CRC: the reader drops it and the oracle sees a record missing.
  std::string bytes = titan::test::read_file(path);
  bytes[kWandbLogBlock + 1000] ^= 0x01;
  const fs::path corrupt = dir.path / "run-corrupt.wandb";
  write_wandb_text(corrupt, bytes);
  CHECK(run_wandb_oracle(
            fmt::format("records \"{}\" \"{}\"", corrupt.string(), (dir.path / "expected.json").string())) != 0);
}

TEST_CASE("W&B run: the wandb package reads its config, one row per step, the summary and the exit code",
          "[metrics][wandb]") {
  titan::test::TempDir dir;
  const nlohmann::json config = {{"training", {{"steps", 3}, {"lr", 8e-4}}}, {"job", {{"dump_folder", "out"}}}};
  write_wandb_text(dir.path / "config.json", config.dump());
  // What the rows must hold, in the JSONL's form; Python's json reads NaN and Infinity.
  write_wandb_text(dir.path / "expected.jsonl",
                   "{\"step\": 1, \"loss\": 10.25, \"lr\": 0.0001, \"n_tokens_seen\": 100}\n"
                   "{\"step\": 2, \"loss\": 0.1, \"lr\": 0.0002, \"n_tokens_seen\": 200}\n"
                   "{\"step\": 2, \"validation_metrics/loss\": 3.141592653589793, \"validation_metrics/tokens\": 64}\n"
                   "{\"step\": 3, \"loss\": NaN, \"lr\": Infinity, \"n_tokens_seen\": 300}\n");
  fs::path folder;
  {
    titan::WandbWriter writer(dir.path, {.project = "titan-test", .id = "abc123", .tags = {"a", "b"}}, config);
    folder = writer.folder();
    CHECK(folder.parent_path() == dir.path / "wandb");
    CHECK(folder.filename().string().starts_with("offline-run-"));
    CHECK(folder.filename().string().ends_with("-abc123"));
    CHECK(writer.path() == folder / "run-abc123.wandb");
    CHECK(fs::is_directory(folder / "files"));
    CHECK(fs::read_symlink(dir.path / "wandb" / "latest-run") == folder.filename());
    writer.write(1, wandb_record(1, {{"loss", 10.25}, {"lr", 1e-4}, {"n_tokens_seen", 100}}));
    writer.write(2, wandb_record(2, {{"loss", 0.1}, {"lr", 2e-4}, {"n_tokens_seen", 200}}));
    writer.write(2,
                 wandb_record(2, {{"validation_metrics/loss", 3.141592653589793}, {"validation_metrics/tokens", 64}}));
    writer.flush();
    // Read while the run goes on (as after a crash): every flushed row, no exit record.
    fs::copy_file(writer.path(), dir.path / "mid.wandb");
    writer.write(3, wandb_record(3, {{"loss", std::nan("")}, {"lr", INFINITY}, {"n_tokens_seen", 300}}));
  }
  const std::string jsonl = (dir.path / "expected.jsonl").string();
  REQUIRE(run_wandb_oracle(fmt::format("run \"{}\" \"{}\" --config=\"{}\" --min-steps=3 --min-keys=5 --exit-code=0 "
                                       "--project=titan-test --run-id=abc123 --tags=a,b",
                                       folder.string(), jsonl, (dir.path / "config.json").string())) == 0);

  // The mid-run copy, alone in a run folder: steps 1 and 2, no exit record.
  const fs::path mid = dir.path / "mid" / "offline-run-20260101_000000-abc123";
  fs::create_directories(mid);
  fs::rename(dir.path / "mid.wandb", mid / "run-abc123.wandb");
  std::string lines = titan::test::read_file(jsonl);
  write_wandb_text(dir.path / "first_two.jsonl", lines.substr(0, lines.find("{\"step\": 3")));
  REQUIRE(run_wandb_oracle(fmt::format("run \"{}\" \"{}\" --min-steps=2 --exit-code=none", mid.string(),
                                       (dir.path / "first_two.jsonl").string())) == 0);
  // The full run checked against the first two steps fails: the oracle sees the third row.
  CHECK(run_wandb_oracle(fmt::format("run \"{}\" \"{}\" --exit-code=0", folder.string(),
                                     (dir.path / "first_two.jsonl").string())) != 0);
}

TEST_CASE("W&B run: an exception unwinding past the writer records exit code 1", "[metrics][wandb]") {
  titan::test::TempDir dir;
  fs::path folder;
  try {
    titan::WandbWriter writer(dir.path, {.id = "crashed1"}, nlohmann::json::object());
    folder = writer.folder();
    writer.write(7, wandb_record(7, {{"loss", 2.5}}));
    throw std::runtime_error("the step failed");
  } catch (const std::runtime_error&) {
  }
  write_wandb_text(dir.path / "expected.jsonl", "{\"step\": 7, \"loss\": 2.5}\n");
  REQUIRE(run_wandb_oracle(fmt::format("run \"{}\" \"{}\" --exit-code=1 --project=torchtitan", folder.string(),
                                       (dir.path / "expected.jsonl").string())) == 0);
}

TEST_CASE("W&B variables: WANDB_MODE, torchtitan's names before the wandb package's, bad values named",
          "[metrics][wandb]") {
  const auto from = [](std::map<std::string, std::string, std::less<>> vars) {
    return titan::wandb_run_from_env([vars](std::string_view name) -> std::optional<std::string> {
      const auto it = vars.find(name);
      return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
    });
  };
  const auto defaults = from({});
  REQUIRE(defaults.has_value());
  CHECK(defaults->project == "torchtitan");
  CHECK(defaults->id.empty());
  CHECK_FALSE(from({{"WANDB_MODE", "disabled"}}).has_value());
  for (const char* mode : {"online", "offline", "dryrun"}) CHECK(from({{"WANDB_MODE", mode}}).has_value());
  CHECK_THROWS_WITH(from({{"WANDB_MODE", "ofline"}}), Catch::Contains("WANDB_MODE") && Catch::Contains("'ofline'"));
  const auto run = from({{"WANDB_PROJECT", "llama"},
                         {"WANDB_TEAM", "lab"},
                         {"WANDB_ENTITY", "me"},
                         {"WANDB_RUN_ID", "r1"},
                         {"WANDB_NAME", "wandb's name"},
                         {"WANDB_RUN_NAME", "torchtitan's name"},
                         {"WANDB_TAGS", "x"},
                         {"WANDB_RUN_TAGS", " 8b, fsdp ,,"},
                         {"WANDB_RUN_GROUP", "sweep"},
                         {"WANDB_JOB_TYPE", "train"},
                         {"WANDB_DIR", "runs/w"}});
  REQUIRE(run.has_value());
  CHECK(run->project == "llama");
  CHECK(run->entity == "lab");
  CHECK(run->id == "r1");
  CHECK(run->name == "torchtitan's name");
  CHECK(run->tags == std::vector<std::string>{"8b", "fsdp"});
  CHECK(run->group == "sweep");
  CHECK(run->job_type == "train");
  CHECK(run->dir == "runs/w");
  CHECK(defaults->dir.empty());

  titan::test::TempDir dir;
  CHECK_THROWS_WITH(titan::WandbWriter(dir.path, {.id = "a/b"}, nlohmann::json::object()),
                    Catch::Contains("WANDB_RUN_ID") && Catch::Contains("'a/b'"));
  CHECK_THROWS_WITH(titan::WandbWriter(dir.path, {.project = "team/llama"}, nlohmann::json::object()),
                    Catch::Contains("WANDB_PROJECT") && Catch::Contains("'team/llama'"));
  write_wandb_text(dir.path / "not_a_folder", "");
  CHECK_THROWS_WITH(titan::WandbWriter(dir.path / "not_a_folder", {}, nlohmann::json::object()),
                    Catch::Contains("not_a_folder"));
}
