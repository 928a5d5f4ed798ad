// SPDX-License-Identifier: BSD-3-Clause
// Test helper for the launcher tests: prints what read_launch_env sees, then behaves as asked.
//   env_probe [--wait] [--wait-first] [--ignore-term] [--fail-rank R --exit-code C [--after-rank0 DIR]]
//             [--lines N]
// --wait: block until killed (the kill tests); --wait-first: the same on a job's first start only
// (TITAN_RESTART_COUNT unset or 0), exit 0 after a restart (the elastic tests); --ignore-term: ignore
// SIGTERM, set before the probe line is printed (the SIGKILL escalation test); --fail-rank: rank R exits
// with status C after printing; --after-rank0 DIR: rank R first waits (up to a minute) until rank 0 of the
// same start printed its line (rank 0 then creates DIR/printed-<restart count>), so the launcher cannot stop
// rank 0 before its line is out; --lines: print N long lines on stdout and on stderr in two writes each
// (the interleaving test).
#include "titan/core/error.hpp"
#include "titan/dist/launch_env.hpp"

#include <unistd.h>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  bool wait = false;
  long fail_rank = -1;
  int exit_code = 1;
  long lines = 0;
  std::string after_rank0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : "0";
    if (arg == "--wait") wait = true;
    if (arg == "--wait-first") {
      const char* restarts = std::getenv("TITAN_RESTART_COUNT");
      wait = restarts == nullptr || std::string(restarts) == "0";
    }
    if (arg == "--ignore-term") std::signal(SIGTERM, SIG_IGN);
    if (arg == "--fail-rank") fail_rank = std::atol(next);
    if (arg == "--exit-code") exit_code = std::atoi(next);
    if (arg == "--lines") lines = std::atol(next);
    if (arg == "--after-rank0") after_rank0 = next;
  }
  titan::dist::LaunchEnv env;
  try {
    env = titan::dist::read_launch_env();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", titan::error_message(e).c_str());
    return 3;
  }
  const char* group_rank = std::getenv("GROUP_RANK");
  std::printf(
      "probe pid=%ld rank=%ld local_rank=%ld world_size=%ld local_world_size=%ld master_addr=%s "
      "master_port=%d source=%s group_rank=%s restart=%s\n",
      static_cast<long>(getpid()), static_cast<long>(env.rank), static_cast<long>(env.local_rank),
      static_cast<long>(env.world_size), static_cast<long>(env.local_world_size), env.master_addr.c_str(),
      env.master_port, env.source.c_str(), group_rank != nullptr ? group_rank : "-",
      std::getenv("TITAN_RESTART_COUNT") != nullptr ? std::getenv("TITAN_RESTART_COUNT") : "-");
  // Small writes on purpose: the launcher must reassemble lines that arrive in pieces.
  const std::string payload(300, static_cast<char>('a' + env.rank % 26));
  for (long i = 0; i < lines; ++i) {
    FILE* stream = i % 2 == 0 ? stdout : stderr;
    std::fprintf(stream, "line %ld begin ", i);
    std::fflush(stream);
    std::fprintf(stream, "%s end\n", payload.c_str());
  }
  std::fflush(stdout);
  if (!after_rank0.empty()) {
    const char* restarts = std::getenv("TITAN_RESTART_COUNT");
    const std::filesystem::path printed =
        std::filesystem::path(after_rank0) / ("printed-" + std::string(restarts != nullptr ? restarts : "0"));
    if (env.rank == 0) std::ofstream(printed).put('\n');  // after the flush: the line is in the pipe
    if (env.rank == fail_rank) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
      while (!std::filesystem::exists(printed) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (env.rank == fail_rank) return exit_code;
  while (wait) pause();
  return 0;
}
