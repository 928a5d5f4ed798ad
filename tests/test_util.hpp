// SPDX-License-Identifier: BSD-3-Clause
// Helpers for all tests: where the oracles and data live, temp dirs, running Python oracles.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "titan/core/error.hpp"

namespace titan::test {

/// Catch2 2.x is not thread-safe: assertions made on rank threads take this lock (RANK_CHECK).
inline std::mutex& catch_mutex() {
  static std::mutex m;
  return m;
}

namespace fs = std::filesystem;

/// The message of what `f` throws, or "(no error)".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return error_message(e);
  }
  return "(no error)";
}

/// TITAN_TEST_TIME_SCALE (default 1), read once: how many times slower than usual this machine runs the
/// tests (a sanitized build, a busy machine). scripts/sanitized_tests.sh sets 3.
inline double time_scale() {
  static const double scale = [] {
    const char* text = std::getenv("TITAN_TEST_TIME_SCALE");
    if (text == nullptr || *text == '\0') return 1.0;
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    TITAN_CHECK_VALUE(end != text && *end == '\0' && value > 0,
                      "[titan::test::time_scale] expected TITAN_TEST_TIME_SCALE to be a number > 0, got '{}'. "
                      "Set e.g. 3 on a loaded machine, or unset it.",
                      text);
    return value;
  }();
  return scale;
}

/// How long a test waits for something that takes real time (a process to print or exit, a rank to reach
/// a collective): `seconds` times time_scale(). Every wait and the slack of a timing bound ("within the
/// timeout + 10 s": the 10) scale; the product's own timeouts that a test sets and checks do not.
/// Subprocess::read_until and Subprocess::wait apply it to their `seconds` themselves.
inline double patience(double seconds) { return seconds * time_scale(); }
/// The same for a duration (a Mesh's timeouts, a deadline).
inline std::chrono::milliseconds patience(std::chrono::milliseconds wait) {
  return std::chrono::milliseconds(static_cast<int64_t>(static_cast<double>(wait.count()) * time_scale()));
}

// Where this build's folders are: defined in one source the build generates (tests/paths.cpp.in), so no
// other test object carries an absolute path in its flags and a clone elsewhere hits ccache.
/// The repo's tests/ folder (with assets/ and oracles/).
fs::path test_dir();
/// The Python interpreter that has the oracle packages (HF tokenizers, torch, ...).
const char* python();
/// The repo's root folder.
fs::path source_dir();
/// The build folder (bin/ holds the programs).
fs::path binary_dir();
/// tests/assets/tinyshakespeare/input.txt: 40,000 lines of Shakespeare (see tests/assets/README.md).
inline fs::path tinyshakespeare() { return test_dir() / "assets" / "tinyshakespeare" / "input.txt"; }
/// The folder with the tests' tokenizer.json: a 2,048-entry byte-level BPE that HF `tokenizers` trains
/// on tinyshakespeare during the build (tests/oracles/make_tokenizer.py).
fs::path test_tokenizer();

/// A fresh temporary directory removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("titan-test-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

/// Runs `python3 <tests/oracles/script> args...`; returns its exit status.
inline int run_python(const std::string& script, const std::string& args) {
  const std::string cmd =
      std::string("\"") + python() + "\" \"" + (test_dir() / "oracles" / script).string() + "\" " + args;
  return std::system(cmd.c_str());
}

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

/// step -> loss from a run's metrics.jsonl (a resumed run appends; the latest line of a step wins).
inline std::map<int64_t, double> metrics_losses(const fs::path& dump) {
  std::map<int64_t, double> out;
  std::istringstream in(read_file(dump / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss_metrics/global_avg_loss")) {
      out[j.at("step").get<int64_t>()] = j.at("loss_metrics/global_avg_loss").get<double>();
    }
  }
  return out;
}

/// A checkpoint folder's index.json.
inline nlohmann::json checkpoint_index(const fs::path& folder) {
  return nlohmann::json::parse(read_file(folder / "index.json"));
}

}  // namespace titan::test

// Assertions on rank threads (dist::run_local_ranks): the condition is evaluated first, outside the
// lock (it may run a collective), then reported under the lock, with an optional message.
#define RANK_CHECK(...) RANK_CHECK_INFO("", __VA_ARGS__)
#define RANK_CHECK_INFO(message, ...)                                            \
  do {                                                                           \
    const bool titan_ok_ = static_cast<bool>(__VA_ARGS__);                       \
    std::lock_guard<std::mutex> titan_catch_lock_(::titan::test::catch_mutex()); \
    INFO(message << " [" << #__VA_ARGS__ << "]");                                \
    CHECK(titan_ok_);                                                            \
  } while (0)
