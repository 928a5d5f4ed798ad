// SPDX-License-Identifier: BSD-3-Clause
// A child process for the launcher tests: stdout and stderr merged into one pipe, read with deadlines
// so a hung child fails the test instead of hanging it. A titan job launched over processes runs on the strict
// backend unless its command line names a backend (strict_by_default).
#pragma once

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "test_util.hpp"

extern char** environ;

namespace titan::test {

/// argv, with `--comm.backend strict` (and `--fault_tolerance.process_group strict`) appended when it launches a
/// titan program that reads them over processes (under titan-run or torchrun) and does not name that backend itself:
/// every multi-process test job runs on the strict backend, Gloo with NCCL's rules enforced, unless it opts out with
/// `--comm.backend gloo` and says why (docs/testing.md lists those).
inline std::vector<std::string> strict_by_default(std::vector<std::string> argv) {
  const auto name = [](const std::string& arg) { return std::filesystem::path(arg).filename().string(); };
  const auto any = [&](auto&& pred) { return std::any_of(argv.begin(), argv.end(), pred); };
  const bool launched =
      any([&](const std::string& a) { return name(a) == "titan-run" || a == "torch.distributed.run"; });
  // The programs whose mesh follows comm.backend: the trainers, the examples that parse a JobConfig, generation.
  static const std::vector<std::string> kPrograms = {"train", "train_llama3", "custom_loop", "custom_model",
                                                     "titan-generate"};
  const bool titan_job = any(
      [&](const std::string& a) { return std::find(kPrograms.begin(), kPrograms.end(), name(a)) != kPrograms.end(); });
  if (!launched || !titan_job) return argv;
  for (const std::string key : {"--comm.backend", "--fault_tolerance.process_group"}) {
    if (!any([&](const std::string& a) { return a == key; })) argv.insert(argv.end(), {key, "strict"});
  }
  return argv;
}

class Subprocess {
 public:
  using Clock = std::chrono::steady_clock;

  /// Starts argv[0] (a path) with the test's environment changed by `env` (nullopt removes a variable), and a
  /// titan job over processes on the strict backend (strict_by_default).
  explicit Subprocess(const std::vector<std::string>& command,
                      const std::map<std::string, std::optional<std::string>>& env = {}) {
    const std::vector<std::string> argv = strict_by_default(command);
    std::vector<std::string> entries;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      if (env.count(entry.substr(0, entry.find('='))) == 0) entries.push_back(entry);
    }
    for (const auto& [name, value] : env) {
      if (value) entries.push_back(name + "=" + *value);
    }
    int fds[2];
    REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
    std::vector<char*> args = c_strings(argv);
    std::vector<char*> envp = c_strings(entries);
    const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    fd_ = fds[0];
    REQUIRE(rc == 0);
  }

  ~Subprocess() {
    if (!status_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

  /// Reads until `done(output())` holds or the output ends; false when patience(`seconds`) pass first.
  bool read_until(const std::function<bool(const std::string&)>& done, double seconds) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(patience(seconds) * 1000));
    while (!done(output_)) {
      if (fd_ < 0) return false;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buffer[4096];
      const ssize_t n = read(fd_, buffer, sizeof(buffer));
      if (n > 0) {
        output_.append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fd_);
        fd_ = -1;
      }
    }
    return true;
  }

  /// Reads to the end and reaps; the waitpid status, or nullopt (child killed) when patience(`seconds`)
  /// pass first.
  std::optional<int> wait(double seconds) {
    const auto start = Clock::now();
    read_until([](const std::string&) { return false; }, seconds);
    while (!status_) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = status;
      } else if (Clock::now() - start > std::chrono::milliseconds(static_cast<int64_t>(patience(seconds) * 1000))) {
        return std::nullopt;
      } else {
        usleep(10000);  // the output is closed already; the exit follows within moments
      }
    }
    return status_;
  }

 private:
  static std::vector<char*> c_strings(const std::vector<std::string>& strings) {
    std::vector<char*> out;
    for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
    out.push_back(nullptr);
    return out;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  std::string output_;
  std::optional<int> status_;
};

/// The exit code of a waitpid status; -signal when it was killed.
inline int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status); }

}  // namespace titan::test
