// SPDX-License-Identifier: BSD-3-Clause
#include "supervisor.hpp"

#include "line_prefixer.hpp"
#include "rank_process.hpp"
#include "rendezvous.hpp"

#include <poll.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace titan_run {
namespace {

using Clock = std::chrono::steady_clock;

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// A folder of the launcher's own for the hang report: a rank whose heartbeat finder saw another rank hang
// writes one line to <folder>/hang (TITAN_RUN_HANG_FILE, src/dist/heartbeat.cpp) before any rank exits, so
// the failure can name the hung rank rather than the first rank that exited. Removed with the launcher.
class HangReport {
 public:
  HangReport() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/titan-run.XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) {
      dir_ = pattern;
      file_ = dir_ + "/hang";
    }  // else no report: the failure names the first rank that exited, as without a heartbeat
  }
  ~HangReport() {
    if (dir_.empty()) return;
    unlink(file_.c_str());
    rmdir(dir_.c_str());
  }
  HangReport(const HangReport&) = delete;
  HangReport& operator=(const HangReport&) = delete;

  const std::string& file() const { return file_; }
  void clear() const {
    if (!file_.empty()) unlink(file_.c_str());
  }
  // The report's first line ("rank 1 hung (no progress for 5 s at step 4, data loading; detected by rank 0)"),
  // empty when no rank wrote one.
  std::string read() const {
    std::ifstream in(file_);
    std::string line;
    if (!file_.empty() && in) std::getline(in, line);
    return line;
  }

 private:
  std::string dir_{};
  std::string file_{};
};

struct Rank {
  RankProcess process;
  LinePrefixer out;
  LinePrefixer err;
  bool running = true;
  int status = 0;  // waitpid status once it has exited
};

class Supervisor {
 public:
  explicit Supervisor(const Options& options) : options_(options), round_(options) {}
  int run();

 private:
  int run_attempt();
  int run_elastic();
  RendezvousEvent wait_for_rendezvous();
  void on_rendezvous_event(const RendezvousEvent& e);
  void start_ranks();
  void poll_once();
  void on_signal();
  void reap();
  void read_output(int& fd, LinePrefixer& prefixer);
  void stop_ranks(int sig);
  void escalate_if_due();
  double grace_seconds() const;
  int running_count() const;
  std::string failure() const;
  int exit_status();

  const Options& options_;
  Options round_;  // options_ with this round's node rank and node count (elastic), else options_
  int signal_fd_ = -1;
  sigset_t launcher_mask_{};  // restored in the ranks
  Attempt attempt_{};         // restarts so far and why
  std::vector<Rank> ranks_;
  std::optional<int> failed_;                       // index of the first rank that failed
  int stopped_others_ = 0;                          // ranks still running when the failure or signal came
  int interrupt_ = 0;                               // the signal that asked the launcher to stop, 0 when none
  int stop_signal_ = 0;                             // the first signal sent to stop the ranks
  std::optional<Clock::time_point> kill_deadline_;  // SIGKILL whoever still runs after this
  bool escalated_ = false;                          // SIGKILL was sent: nothing left to wait for
  HangReport hang_report_{};                        // where a rank names a hung rank
  std::string hang_{};                              // what it held when the first rank failed; empty: nothing
  // Elastic (--nnodes MIN:MAX): the rendezvous, this round's store port, and what it asked mid-round.
  std::unique_ptr<Rendezvous> rdzv_;
  int round_port_ = 0;
  std::optional<RendezvousEvent> rdzv_stop_;  // stop (another node failed, was lost or joined) or exit
};

void Supervisor::start_ranks() {
  // A fresh port per attempt: the previous store's port may linger in TIME_WAIT. A fixed --master-port is
  // reused, which works because every rank of the previous attempt has exited.
  const int port = rdzv_ ? round_port_ : options_.master_port != 0 ? options_.master_port : pick_free_port();
  ranks_.reserve(round_.nproc_per_node);
  for (int local = 0; local < round_.nproc_per_node; ++local) {
    const int rank = global_rank(round_, local);
    const std::string prefix = "[rank " + std::to_string(rank) + "] ";
    RankProcess process = spawn_rank(
        round_.command, rank_environment(round_, local, port, attempt_, hang_report_.file()), rank, launcher_mask_);
    ranks_.push_back(Rank{process, LinePrefixer(prefix, STDOUT_FILENO), LinePrefixer(prefix, STDERR_FILENO)});
  }
}

int Supervisor::running_count() const {
  int n = 0;
  for (const Rank& r : ranks_) n += r.running;
  return n;
}

// Signals every running rank's process group; the first call starts the grace period.
void Supervisor::stop_ranks(int sig) {
  for (const Rank& r : ranks_) {
    if (r.running) kill(-r.process.pid, sig);
  }
  if (!kill_deadline_) {
    stop_signal_ = sig;
    const auto grace = std::chrono::duration<double>(grace_seconds());
    kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(grace);
  }
}

// After a failure the others cannot finish their step (a trainer waits in a collective with the dead rank
// and saves nothing), so they get the shorter --failure-grace-seconds; a signal to the launcher (preemption:
// each rank saves a checkpoint first) gets --grace-seconds.
double Supervisor::grace_seconds() const {
  if (rdzv_stop_ && interrupt_ == 0) {  // a membership change lets the ranks save; a failure elsewhere does not
    return rdzv_stop_->graceful ? options_.grace_seconds
                                : std::min(options_.grace_seconds, options_.failure_grace_seconds);
  }
  return failed_ && interrupt_ == 0 ? std::min(options_.grace_seconds, options_.failure_grace_seconds)
                                    : options_.grace_seconds;
}

void Supervisor::escalate_if_due() {
  if (!kill_deadline_ || escalated_ || Clock::now() < *kill_deadline_ || running_count() == 0) return;
  std::string late;
  for (const Rank& r : ranks_) {
    if (r.running) late += (late.empty() ? "" : ", ") + std::to_string(r.process.rank);
  }
  std::ostringstream grace;
  grace << grace_seconds();  // 5, 0.5: no trailing zeros
  say("rank(s) " + late + " still running " + grace.str() + " s after " + signal_name(stop_signal_) + "; sent SIGKILL");
  stop_ranks(SIGKILL);
  escalated_ = true;
}

void Supervisor::reap() {
  int status = 0;
  pid_t pid = 0;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      Rank& r = ranks_[i];
      if (r.process.pid != pid) continue;
      r.running = false;
      r.status = status;
      // The group id stays reserved while anything in the group lives, so killing it now cannot hit an
      // unrelated process; it removes whatever the rank left behind.
      kill(-pid, SIGKILL);
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && !failed_ && interrupt_ == 0) {
        failed_ = static_cast<int>(i);
        // A hang reported before this first exit caused it; one written later (the dead rank's heartbeat
        // going stale during the grace period) would not, so the report is read now.
        hang_ = hang_report_.read();
        stopped_others_ = running_count();
        stop_ranks(SIGTERM);
      }
    }
  }
}

void Supervisor::on_signal() {
  signalfd_siginfo info{};
  while (read(signal_fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) {
      reap();
    } else if (interrupt_ != 0 || failed_) {
      if (interrupt_ == 0) interrupt_ = sig;  // no restart after this attempt
      stop_ranks(SIGKILL);                    // asked twice: stop waiting
    } else {
      interrupt_ = sig;
      stopped_others_ = running_count();
      stop_ranks(sig);
    }
  }
}

void Supervisor::read_output(int& fd, LinePrefixer& prefixer) {
  char buffer[65536];
  const ssize_t n = read(fd, buffer, sizeof(buffer));
  if (n > 0) {
    prefixer.feed(buffer, static_cast<std::size_t>(n));
  } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    prefixer.finish();
    close(fd);
    fd = -1;
  }
}

void Supervisor::poll_once() {
  std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
  std::vector<std::pair<int*, LinePrefixer*>> streams;
  for (Rank& r : ranks_) {
    for (auto [fd, prefixer] : {std::pair{&r.process.out_fd, &r.out}, std::pair{&r.process.err_fd, &r.err}}) {
      if (*fd < 0) continue;
      fds.push_back({*fd, POLLIN, 0});
      streams.emplace_back(fd, prefixer);
    }
  }
  const std::size_t rdzv_first = fds.size();
  if (rdzv_) {
    for (const pollfd& p : rdzv_->fds()) fds.push_back(p);
  }
  int timeout_ms = -1;
  if (running_count() == 0) {
    // Every rank is gone; a pipe still open is held by something that escaped its group. Bounded wait.
    timeout_ms = 1000;
  } else if (kill_deadline_ && !escalated_) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*kill_deadline_ - Clock::now());
    timeout_ms = static_cast<int>(std::max<int64_t>(0, left.count()) + 1);
  }
  if (rdzv_ && rdzv_->timeout_ms() >= 0) {
    timeout_ms = timeout_ms < 0 ? rdzv_->timeout_ms() : std::min(timeout_ms, rdzv_->timeout_ms());
  }
  const int ready = poll(fds.data(), fds.size(), timeout_ms);
  if (ready == 0 && running_count() == 0) {
    for (auto [fd, prefixer] : streams) {
      prefixer->finish();
      close(*fd);
      *fd = -1;
    }
    return;
  }
  if (fds[0].revents != 0) on_signal();
  for (std::size_t i = 1; i < rdzv_first; ++i) {
    if (fds[i].revents != 0) read_output(*streams[i - 1].first, *streams[i - 1].second);
  }
  if (rdzv_) {
    rdzv_->on_poll(std::vector<pollfd>(fds.begin() + static_cast<std::ptrdiff_t>(rdzv_first), fds.end()));
    while (auto e = rdzv_->next_event()) on_rendezvous_event(*e);
  }
  escalate_if_due();
}

// "rank 1 was killed by signal 9 (SIGKILL)" or "rank 1 exited with status 7"; after a hang the heartbeat
// saw, the hung rank first: "rank 1 hung (no progress for 5 s at step 4, data loading; detected by rank 0);
// rank 0 exited with status 1" (the first rank to exit is then only the one that stopped the job).
std::string Supervisor::failure() const {
  const Rank& r = ranks_[*failed_];
  const std::string who = "rank " + std::to_string(r.process.rank);
  const std::string cause = hang_.empty() ? std::string() : hang_ + "; ";
  if (WIFSIGNALED(r.status)) {
    const int sig = WTERMSIG(r.status);
    return cause + who + " was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
  }
  return cause + who + " exited with status " + std::to_string(WEXITSTATUS(r.status));
}

int Supervisor::exit_status() {
  if (rdzv_stop_) return 0;  // the rendezvous ended the round: whatever the ranks did after that is no failure
  const std::string others = stopped_others_ == 0 ? std::string()
                                                  : "; stopped the other " + std::to_string(stopped_others_) +
                                                        (stopped_others_ == 1 ? " rank" : " ranks");
  if (failed_) {
    const Rank& r = ranks_[*failed_];
    say(failure() + others);
    return WIFSIGNALED(r.status) ? 128 + WTERMSIG(r.status) : WEXITSTATUS(r.status);
  }
  if (interrupt_ != 0) {
    // Ranks that handle the signal (a trainer saving a checkpoint on preemption) and then exit 0 have
    // stopped cleanly: the job succeeded as far as it went.
    bool clean = true;
    for (const Rank& r : ranks_) clean = clean && WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0;
    if (clean) {
      say("received " + signal_name(interrupt_) + "; every rank stopped and exited 0");
      return 0;
    }
    say("received " + signal_name(interrupt_) + "; stopped " + std::to_string(stopped_others_) + " running rank(s)");
    return 128 + interrupt_;
  }
  return 0;
}

// One start of the job: runs the ranks until all have exited and returns what the launcher would exit with.
int Supervisor::run_attempt() {
  ranks_.clear();
  failed_.reset();
  stopped_others_ = 0;
  stop_signal_ = 0;
  kill_deadline_.reset();
  escalated_ = false;
  hang_report_.clear();
  hang_.clear();
  try {
    start_ranks();
  } catch (...) {
    stop_ranks(SIGKILL);
    while (running_count() > 0 && waitpid(-1, nullptr, 0) > 0) {
    }
    throw;
  }
  auto streams_open = [this] {
    for (const Rank& r : ranks_) {
      if (r.process.out_fd >= 0 || r.process.err_fd >= 0) return true;
    }
    return false;
  };
  while (running_count() > 0 || streams_open()) poll_once();
  return exit_status();
}

// Mid-round: another node failed, was lost or joined (stop), or the job is over (exit): stop this node's ranks.
void Supervisor::on_rendezvous_event(const RendezvousEvent& e) {
  if (e.kind == RendezvousEvent::Kind::start || (rdzv_stop_ && rdzv_stop_->kind == RendezvousEvent::Kind::exit)) return;
  rdzv_stop_ = e;
  stopped_others_ = running_count();
  if (running_count() > 0) stop_ranks(SIGTERM);
}

// Between rounds: the next thing the rendezvous asks, or an exit when titan-run itself got a signal.
RendezvousEvent Supervisor::wait_for_rendezvous() {
  while (true) {
    if (auto e = rdzv_->next_event()) return *e;
    std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
    for (const pollfd& p : rdzv_->fds()) fds.push_back(p);
    poll(fds.data(), fds.size(), rdzv_->timeout_ms());
    if (fds[0].revents != 0) on_signal();
    if (interrupt_ != 0) {
      return {.kind = RendezvousEvent::Kind::exit,
              .round = {},
              .graceful = false,
              .status = 128 + interrupt_,
              .reason = "received " + signal_name(interrupt_) + " between rounds"};
    }
    rdzv_->on_poll(std::vector<pollfd>(fds.begin() + 1, fds.end()));
  }
}

// --nnodes MIN:MAX: rounds set by the rendezvous until the job is over.
int Supervisor::run_elastic() {
  rdzv_ = std::make_unique<Rendezvous>(options_);
  rdzv_->ready();
  while (true) {
    // The job is over: all done, or a failure past --max-restarts (named with the status it ends with).
    const auto leave = [](const RendezvousEvent& e) {
      if (!e.reason.empty()) say(e.reason + (e.status == 0 ? "" : "; exit status " + std::to_string(e.status)));
      return e.status;
    };
    const RendezvousEvent e = wait_for_rendezvous();
    if (e.kind == RendezvousEvent::Kind::exit) return leave(e);
    if (e.kind == RendezvousEvent::Kind::stop) {  // nothing runs here (this node had finished): ready again
      rdzv_->ready();
      continue;
    }
    round_.nnodes = e.round.nnodes;
    round_.node_rank = e.round.node_rank;
    round_port_ = e.round.master_port;
    attempt_ = {.restart_count = e.round.restart_count, .reason = e.round.reason};
    const int first = global_rank(round_, 0), last = global_rank(round_, round_.nproc_per_node - 1);
    const std::string layout = std::to_string(round_.nnodes) + " node(s), world size " +
                               std::to_string(round_.nnodes * round_.nproc_per_node) + "; this node is node " +
                               std::to_string(round_.node_rank) + " (ranks " + std::to_string(first) + "-" +
                               std::to_string(last) + ")";
    if (attempt_.restart_count == 0) {
      say("starting the job on " + layout);
    } else {
      say("restarting the job (restart " + std::to_string(attempt_.restart_count) + ") on " + layout + " after " +
          attempt_.reason);
    }
    rdzv_stop_.reset();
    interrupt_ = 0;
    const int status = run_attempt();
    if (rdzv_stop_ && rdzv_stop_->kind == RendezvousEvent::Kind::exit) return leave(*rdzv_stop_);
    if (rdzv_stop_) {
      rdzv_->ready();
    } else if (interrupt_ != 0) {
      // A signal to this titan-run: its ranks have stopped; if cleanly (a trainer saved and every rank of
      // the job stops after the same step), the job is done here, else this node leaves it.
      if (status == 0) rdzv_->done();
      return status;
    } else if (failed_) {
      rdzv_->failed(status, failure());
    } else {
      rdzv_->done();
    }
  }
}

int Supervisor::run() {
  // Signals arrive through a descriptor in the poll loop instead of handlers: no async-signal-safety
  // concerns, and a SIGCHLD between two checks cannot be lost.
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, sig);
  sigprocmask(SIG_BLOCK, &handled, &launcher_mask_);
  signal_fd_ = signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd_ < 0) throw std::runtime_error(std::string("signalfd: ") + std::strerror(errno));
  // A closed stdout must not kill the launcher before it has stopped the ranks.
  signal(SIGPIPE, SIG_IGN);
  if (options_.elastic) {
    const int status = run_elastic();
    close(signal_fd_);
    return status;
  }
  int status = run_attempt();
  // torchrun's --max-restarts: a failure (not a signal to the launcher) starts every rank again; the
  // program resumes from its newest checkpoint.
  while (failed_ && interrupt_ == 0 && attempt_.restart_count < options_.max_restarts) {
    ++attempt_.restart_count;
    attempt_.reason = failure();
    say("restarting the job (restart " + std::to_string(attempt_.restart_count) + " of " +
        std::to_string(options_.max_restarts) + ") after " + attempt_.reason);
    status = run_attempt();
  }
  close(signal_fd_);
  return status;
}

}  // namespace

int supervise(const Options& options) { return Supervisor(options).run(); }

}  // namespace titan_run
