// SPDX-License-Identifier: BSD-3-Clause
#include "titan/core/log.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace titan::log {
namespace {

Level level_from_env() {
  const char* v = std::getenv("TITAN_LOG_LEVEL");
  if (v == nullptr) return Level::info;
  if (std::strcmp(v, "debug") == 0) return Level::debug;
  if (std::strcmp(v, "warn") == 0) return Level::warn;
  if (std::strcmp(v, "error") == 0) return Level::error;
  return Level::info;
}

// Until the trainer confirms it, the launcher's word (torchrun/titan-run's RANK, Slurm's
// SLURM_PROCID), so lines printed before the mesh exists are filtered per rank too.
int rank_from_env() {
  for (const char* name : {"RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return 0;
}

std::atomic<int> g_rank{rank_from_env()};
std::atomic<Level> g_level{level_from_env()};
std::atomic<bool> g_color{isatty(fileno(stdout)) != 0};
std::mutex g_mutex;

}  // namespace

void set_rank(int r) { g_rank = r; }
int rank() { return g_rank; }
void set_level(Level l) { g_level = l; }
Level level() { return g_level; }
void set_color(bool enabled) { g_color = enabled; }
bool color() { return g_color; }

void detail::write(Level lvl, bool all_ranks, std::string_view message) {
  if (!all_ranks && g_rank != 0) return;
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&now, &tm);
  const bool colored = g_color && lvl >= Level::warn;
  const char* on = !colored ? "" : (lvl == Level::warn ? "\033[33m" : "\033[31m");
  const char* off = colored ? "\033[39m" : "";
  std::lock_guard<std::mutex> lock(g_mutex);
  FILE* out = lvl >= Level::warn ? stderr : stdout;
  fmt::print(out, "[titan] {:02}:{:02}:{:02} {}{} r{} {}{}\n", tm.tm_hour, tm.tm_min, tm.tm_sec, on,
             kLetters[static_cast<int>(lvl)], g_rank.load(), message, off);
  std::fflush(out);
}

}  // namespace titan::log
