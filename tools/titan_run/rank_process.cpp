// SPDX-License-Identifier: BSD-3-Clause
#include "rank_process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace titan_run {
namespace {

std::runtime_error system_error(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Between fork and exec: only async-signal-safe calls (the launcher is single-threaded, but this
// keeps the child correct regardless).
[[noreturn]] void exec_child(char** argv, char** envp, int out_w, int err_w, pid_t launcher, const sigset_t& mask) {
  setpgid(0, 0);
  // SIGKILL when the launcher dies, so no rank outlives it; if it already died, the request came too late.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(128 + SIGKILL);
  signal(SIGPIPE, SIG_DFL);  // the launcher ignores it; exec would keep that
  sigprocmask(SIG_SETMASK, &mask, nullptr);
  const int null_fd = open("/dev/null", O_RDONLY);
  // A rank outside the terminal's foreground group would stop on reading the terminal; give it nothing.
  if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
  dup2(out_w, STDOUT_FILENO);
  dup2(err_w, STDERR_FILENO);
  execvpe(argv[0], argv, envp);
  const char* reason = strerror(errno);
  const char* parts[] = {"titan-run: cannot run '", argv[0], "': ", reason, "\n"};
  for (const char* part : parts) {
    if (write(STDERR_FILENO, part, strlen(part)) < 0) break;
  }
  _exit(127);
}

}  // namespace

std::vector<std::string> rank_environment(const Options& o, int local_rank, int master_port, const Attempt& attempt,
                                          const std::string& hang_file) {
  const std::vector<std::pair<std::string, std::string>> contract = {
      {"RANK", std::to_string(global_rank(o, local_rank))},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"NODE_RANK", std::to_string(o.node_rank)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(master_port)},
      {"TITAN_RESTART_COUNT", std::to_string(attempt.restart_count)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TITAN_RESTART_REASON", attempt.reason},
      {"TITAN_RUN_HANG_FILE", hang_file},
  };
  std::vector<std::string> env;
  bool has_omp = false;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [key, value] : contract) replaced = replaced || key == name;
    if (!replaced) env.push_back(entry);
    has_omp = has_omp || name == "OMP_NUM_THREADS";
  }
  for (const auto& [key, value] : contract) env.push_back(key + "=" + value);
  // As torchrun does: N ranks each using every core would oversubscribe the node.
  if (!has_omp && o.nproc_per_node > 1) env.push_back("OMP_NUM_THREADS=1");
  return env;
}

int pick_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw system_error("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int saved_errno = errno;
  close(fd);
  errno = saved_errno;
  if (!ok) throw system_error("picking a free port");
  return ntohs(addr.sin_port);
}

RankProcess spawn_rank(const std::vector<std::string>& command, const std::vector<std::string>& env, int rank,
                       const sigset_t& child_mask) {
  // Built before fork: the child must not allocate.
  std::vector<char*> argv = c_strings(command);
  std::vector<char*> envp = c_strings(env);
  int out_pipe[2];
  int err_pipe[2];
  // O_CLOEXEC: no rank inherits another rank's pipes, so each pipe reaches EOF when its rank's group exits.
  if (pipe2(out_pipe, O_CLOEXEC) != 0) throw system_error("pipe");
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    throw system_error("pipe");
  }
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid == 0) exec_child(argv.data(), envp.data(), out_pipe[1], err_pipe[1], launcher, child_mask);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (pid < 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    throw system_error("fork");
  }
  // Also set here: whichever of parent and child runs first, the group exists before it is signalled.
  setpgid(pid, pid);
  fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
  return RankProcess{rank, pid, out_pipe[0], err_pipe[0]};
}

}  // namespace titan_run
