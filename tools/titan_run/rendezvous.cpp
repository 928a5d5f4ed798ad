// SPDX-License-Identifier: BSD-3-Clause
// The elastic rendezvous. Lines over TCP, one message each:
//   agent -> host: "join <nproc_per_node>", "ready", "done", "failed <status> <reason>"
//   host -> agent: "start <node_rank> <nnodes> <master_port> <restart_count> <reason>",
//                  "stop <graceful 0|1> <reason>", "exit <status> <reason>"
// The host is an agent too (node 0): its own messages go through the same handlers without a socket.
#include "rendezvous.hpp"

#include "line_prefixer.hpp"
#include "rank_process.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace titan_run {
namespace {

using Clock = std::chrono::steady_clock;

std::string endpoint(const Options& o) { return o.master_addr + ":" + std::to_string(o.master_port); }

// Every address of host:port, for bind (passive) or connect.
struct AddrInfo {
  addrinfo* list = nullptr;
  AddrInfo(const std::string& host, int port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
    if (rc != 0) throw std::runtime_error("cannot resolve --master-addr '" + host + "': " + gai_strerror(rc));
  }
  ~AddrInfo() { freeaddrinfo(list); }
  AddrInfo(const AddrInfo&) = delete;
  AddrInfo& operator=(const AddrInfo&) = delete;
};

// A listening socket on host:port, or -1 when the address is not this machine's or is taken (another
// agent on this machine hosts the rendezvous).
int try_listen(const std::string& host, int port) {
  const AddrInfo addrs(host, port);
  for (addrinfo* a = addrs.list; a != nullptr; a = a->ai_next) {
    // Non-blocking: accept_peers takes connections until none is left.
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) return fd;
    close(fd);
  }
  return -1;
}

// A node cut off from the others (a link down, a partition) neither closes nor resets its connections:
// without probes each end would wait for the other forever. The kernel probes a quiet connection every
// keep_alive_interval and drops it, failing the next read with ETIMEDOUT, after keep_alive_max_attempt
// probes go unanswered; TCP_USER_TIMEOUT does the same for a line sent and never acknowledged.
void keep_alive(int fd, const Options& o) {
  const int on = 1, interval = o.keep_alive_interval_seconds, attempts = o.keep_alive_max_attempt;
  const unsigned int user_timeout_ms = static_cast<unsigned int>(interval * attempts) * 1000U;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &attempts, sizeof(attempts));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

// "no answer for 15 s (keep_alive_interval 5 s x keep_alive_max_attempt 3)".
std::string silence(const Options& o) {
  return "no answer for " + std::to_string(o.keep_alive_interval_seconds * o.keep_alive_max_attempt) +
         " s (keep_alive_interval " + std::to_string(o.keep_alive_interval_seconds) + " s x keep_alive_max_attempt " +
         std::to_string(o.keep_alive_max_attempt) + ")";
}

int try_connect(const std::string& host, int port) {
  const AddrInfo addrs(host, port);
  for (addrinfo* a = addrs.list; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return fd;
    close(fd);
  }
  return -1;
}

// The first word of `line` and the rest after one space.
std::pair<std::string, std::string> head(const std::string& line) {
  const auto space = line.find(' ');
  if (space == std::string::npos) return {line, ""};
  return {line.substr(0, space), line.substr(space + 1)};
}

int to_int(const std::string& word) {
  try {
    return std::stoi(word);
  } catch (const std::exception&) {
    throw std::runtime_error("elastic rendezvous: malformed number '" + word + "' from another titan-run");
  }
}

// Reads what `fd` has; appends complete lines to `lines`. False at the end of the stream or an error
// (its errno in `error`; 0 at the end of the stream).
bool read_lines(int fd, std::string& partial, std::vector<std::string>& lines, int& error) {
  char buffer[4096];
  const ssize_t n = read(fd, buffer, sizeof(buffer));
  error = n < 0 ? errno : 0;
  if (n <= 0) return n < 0 && (error == EINTR || error == EAGAIN);
  partial.append(buffer, static_cast<std::size_t>(n));
  for (auto nl = partial.find('\n'); nl != std::string::npos; nl = partial.find('\n')) {
    lines.push_back(partial.substr(0, nl));
    partial.erase(0, nl + 1);
  }
  return true;
}

// A host -> agent line as the agent acts on it.
RendezvousEvent parse_event(const std::string& line) {
  const auto [kind, rest] = head(line);
  RendezvousEvent e;
  if (kind == "start") {
    std::istringstream in(rest);
    std::string node_rank, nnodes, port, restarts;
    in >> node_rank >> nnodes >> port >> restarts;
    e.kind = RendezvousEvent::Kind::start;
    e.round = {.node_rank = to_int(node_rank),
               .nnodes = to_int(nnodes),
               .master_port = to_int(port),
               .restart_count = to_int(restarts),
               .reason = {}};
    std::getline(in >> std::ws, e.round.reason);
  } else if (kind == "stop" || kind == "exit") {
    const auto [number, reason] = head(rest);
    if (kind == "stop") {
      e.kind = RendezvousEvent::Kind::stop;
      e.graceful = number == "1";
    } else {
      e.kind = RendezvousEvent::Kind::exit;
      e.status = to_int(number);
    }
    e.reason = reason;
  } else {
    throw std::runtime_error("elastic rendezvous: unknown message '" + line + "' from the host");
  }
  return e;
}

}  // namespace

struct Rendezvous::Impl {
  // A node as the host sees it.
  struct Peer {
    enum class State { joined, ready, running, finished, gone };
    int fd = -1;         // -1: the host's own agent
    int node_rank = -1;  // in the last round it was started in; -1: never started
    std::string partial{};
    State state = State::joined;
    bool in_round = false;
    bool done = false;
  };
  enum class Phase { gathering, running, over };

  Options o;
  std::deque<RendezvousEvent> events{};
  // host
  int listen_fd = -1;
  std::vector<Peer> peers{};  // peers[0] is this agent
  Phase phase = Phase::gathering;
  int restart_count = 0;
  int failures = 0;
  int round_nodes = 0;
  std::string reason{};
  Clock::time_point gathering_since{};
  std::optional<Clock::time_point> last_call{};
  // agent of another node
  int fd = -1;
  std::string partial{};
  std::vector<std::string> outbox{};  // lines written once connected
  bool exited = false;
  Clock::time_point connect_deadline{};

  explicit Impl(const Options& options) : o(options) {
    listen_fd = try_listen(o.master_addr, o.master_port);
    gathering_since = Clock::now();
    if (listen_fd >= 0) {
      peers.push_back(Peer{});
      say("hosting the elastic rendezvous at " + endpoint(o) + " for " + std::to_string(o.min_nodes) + " to " +
          std::to_string(o.max_nodes) + " nodes of " + std::to_string(o.nproc_per_node) + " rank(s)");
    } else {
      connect_deadline = Clock::now() + seconds(o.join_timeout_seconds);
      send("join " + std::to_string(o.nproc_per_node));
      connect_now();
    }
  }

  ~Impl() {
    for (const Peer& p : peers) {
      if (p.fd >= 0) close(p.fd);
    }
    if (listen_fd >= 0) close(listen_fd);
    if (fd >= 0) close(fd);
  }

  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  bool host() const { return listen_fd >= 0; }

  // ---- agent of another node ----
  void send(const std::string& line) {
    if (fd >= 0) {
      write_all(fd, line + "\n");
    } else {
      outbox.push_back(line);
    }
  }

  void connect_now() {
    fd = try_connect(o.master_addr, o.master_port);
    if (fd < 0) {
      if (Clock::now() >= connect_deadline) {
        fail_locally("cannot reach the elastic rendezvous at " + endpoint(o) + " within join_timeout");
      }
      return;
    }
    keep_alive(fd, o);
    say("joined the elastic rendezvous at " + endpoint(o));
    for (const std::string& line : outbox) write_all(fd, line + "\n");
    outbox.clear();
  }

  void fail_locally(const std::string& why) {
    if (exited) return;
    exited = true;
    // Filled member by member: GCC 12 -O3 warns (maybe-uninitialized) on a designated temporary here.
    RendezvousEvent e;
    e.kind = RendezvousEvent::Kind::exit;
    e.status = 1;
    e.reason = why;
    events.push_back(std::move(e));
  }

  void on_host_line(const std::string& line) {
    RendezvousEvent e = parse_event(line);
    if (e.kind == RendezvousEvent::Kind::exit) exited = true;
    events.push_back(std::move(e));
  }

  // ---- host ----
  void deliver(Peer& p, const std::string& line) {
    if (p.fd < 0) {
      on_host_line(line);
    } else {
      write_all(p.fd, line + "\n");
    }
  }

  static std::string node_name(const Peer& p) {
    return p.node_rank < 0 ? std::string("a joining node") : "node " + std::to_string(p.node_rank);
  }

  void on_peer_line(Peer& p, const std::string& line) {
    const auto [kind, rest] = head(line);
    if (kind == "join") {
      if (to_int(rest) != o.nproc_per_node) {
        write_all(p.fd, "exit 2 every node must run the same --nproc-per-node (" + std::to_string(o.nproc_per_node) +
                            " on the host, " + rest + " here)\n");
        drop(p);
        return;
      }
      if (phase == Phase::over) write_all(p.fd, "exit 1 the job is over\n");
      return;
    }
    const bool in_round = phase == Phase::running && p.in_round;
    if (kind == "ready" || (!in_round && (kind == "done" || kind == "failed"))) {
      // Outside a running round every report means the node's ranks have exited: ready for the next.
      p.state = Peer::State::ready;
      if (phase == Phase::gathering) check_round();
      if (phase == Phase::running && !p.in_round) maybe_grow();
      return;
    }
    if (kind == "done") {
      p.state = Peer::State::finished;
      p.done = true;
      const bool all_done =
          std::all_of(peers.begin(), peers.end(), [](const Peer& q) { return !q.in_round || q.done; });
      if (all_done) finish(0, "");
      return;
    }
    if (kind == "failed") {
      p.state = Peer::State::finished;
      const auto [status, why] = head(rest);
      node_failed(to_int(status), node_name(p) + ": " + why);
      return;
    }
    throw std::runtime_error("elastic rendezvous: unknown message '" + line + "' from " + node_name(p));
  }

  void drop(Peer& p) {
    if (p.fd >= 0) close(p.fd);
    p.fd = -1;
    p.state = Peer::State::gone;
  }

  // `error`: the read's errno; ETIMEDOUT when the keep-alive probes went unanswered (cut off, or its host down).
  void on_peer_lost(Peer& p, int error) {
    const bool lost_in_round = phase == Phase::running && p.in_round && !p.done;
    p.in_round = false;
    drop(p);
    if (lost_in_round) {
      node_failed(1, node_name(p) + " was lost (its titan-run stopped answering" +
                         (error == ETIMEDOUT ? ": " + silence(o) + "; cut off, or its host is down" : std::string()) +
                         ")");
    } else if (phase == Phase::gathering) {
      check_round();
    }
  }

  void node_failed(int status, const std::string& why) {
    if (failures >= o.max_restarts) {
      finish(status, why);
      return;
    }
    ++failures;
    restart(why, /*graceful=*/false);
  }

  // Ends the round: every node of it stops its ranks and reports ready again.
  void restart(const std::string& why, bool graceful) {
    ++restart_count;
    reason = why;
    phase = Phase::gathering;
    gathering_since = Clock::now();
    last_call.reset();
    for (Peer& p : peers) {
      if (p.state == Peer::State::gone || !p.in_round) continue;
      p.in_round = false;
      p.done = false;
      p.state = Peer::State::joined;
      deliver(p, std::string("stop ") + (graceful ? "1 " : "0 ") + why);
    }
    check_round();
  }

  void finish(int status, const std::string& why) {
    phase = Phase::over;
    for (Peer& p : peers) {
      if (p.state != Peer::State::gone) deliver(p, "exit " + std::to_string(status) + " " + why);
    }
  }

  // A node ready while a round runs below --nnodes MAX: the job starts again with it.
  void maybe_grow() {
    if (round_nodes >= o.max_nodes) return;
    int waiting = 0;
    for (const Peer& p : peers) waiting += p.state == Peer::State::ready && !p.in_round;
    if (waiting == 0) return;
    restart(std::to_string(waiting) + " node(s) joined", /*graceful=*/true);
  }

  // Starts the round once the nodes ready reach MAX, or at least MIN with the host among them and no node
  // still stopping, after last_call_timeout without another joining.
  void check_round() {
    if (phase != Phase::gathering) return;
    int ready = 0, pending = 0;
    for (const Peer& p : peers) {
      ready += p.state == Peer::State::ready;
      pending += p.state == Peer::State::joined;
    }
    const auto now = Clock::now();
    const bool host_ready = peers[0].state == Peer::State::ready;
    const bool joined_enough = ready >= o.min_nodes && host_ready;
    if (joined_enough && (ready >= o.max_nodes || now - gathering_since >= seconds(o.join_timeout_seconds))) {
      start_round();
      return;
    }
    if (!joined_enough || pending > 0) {
      last_call.reset();
      if (now - gathering_since >= seconds(o.join_timeout_seconds)) {
        finish(1, "only " + std::to_string(ready) + " node(s) ready of the " + std::to_string(o.min_nodes) +
                      " --nnodes needs within join_timeout (" + std::to_string(o.join_timeout_seconds) + " s)");
      }
      return;
    }
    if (!last_call) last_call = now + seconds(o.last_call_timeout_seconds);
    if (now >= *last_call) start_round();
  }

  void start_round() {
    std::vector<Peer*> round;
    for (Peer& p : peers) {
      if (p.state == Peer::State::ready && static_cast<int>(round.size()) < o.max_nodes) round.push_back(&p);
    }
    const int port = pick_free_port();
    round_nodes = static_cast<int>(round.size());
    phase = Phase::running;
    last_call.reset();
    for (std::size_t k = 0; k < round.size(); ++k) {
      Peer& p = *round[k];
      p.in_round = true;
      p.node_rank = static_cast<int>(k);
      p.done = false;
      p.state = Peer::State::running;
      deliver(p, "start " + std::to_string(k) + " " + std::to_string(round.size()) + " " + std::to_string(port) + " " +
                     std::to_string(restart_count) + " " + reason);
    }
  }

  void accept_peers() {
    while (true) {
      const int peer = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (peer < 0) return;
      keep_alive(peer, o);
      Peer p;
      p.fd = peer;
      peers.push_back(std::move(p));
    }
  }
};

Rendezvous::Rendezvous(const Options& options) : impl_(std::make_unique<Impl>(options)) {}

Rendezvous::~Rendezvous() = default;

bool Rendezvous::is_host() const { return impl_->host(); }

void Rendezvous::ready() {
  if (impl_->host()) {
    impl_->on_peer_line(impl_->peers[0], "ready");
  } else {
    impl_->send("ready");
  }
}

void Rendezvous::done() {
  if (impl_->host()) {
    impl_->on_peer_line(impl_->peers[0], "done");
  } else {
    impl_->send("done");
  }
}

void Rendezvous::failed(int status, const std::string& reason) {
  const std::string line = "failed " + std::to_string(status) + " " + reason;
  if (impl_->host()) {
    impl_->on_peer_line(impl_->peers[0], line);
  } else {
    impl_->send(line);
  }
}

std::vector<pollfd> Rendezvous::fds() const {
  std::vector<pollfd> out;
  if (impl_->host()) {
    out.push_back({impl_->listen_fd, POLLIN, 0});
    for (const auto& p : impl_->peers) {
      if (p.fd >= 0) out.push_back({p.fd, POLLIN, 0});
    }
  } else if (impl_->fd >= 0) {
    out.push_back({impl_->fd, POLLIN, 0});
  }
  return out;
}

int Rendezvous::timeout_ms() const {
  const auto until = [](Clock::time_point t) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left + 1, 0, 1000));
  };
  if (!impl_->host()) return impl_->fd < 0 && !impl_->exited ? 100 : -1;
  if (impl_->phase != Impl::Phase::gathering) return -1;
  if (impl_->last_call) return until(*impl_->last_call);
  return until(impl_->gathering_since + Impl::seconds(impl_->o.join_timeout_seconds));
}

void Rendezvous::on_poll(const std::vector<pollfd>& polled) {
  Impl& r = *impl_;
  if (!r.host()) {
    if (r.fd < 0) {
      if (!r.exited) r.connect_now();
      return;
    }
    for (const pollfd& p : polled) {
      if (p.fd != r.fd || p.revents == 0) continue;
      std::vector<std::string> lines;
      int error = 0;
      const bool open = read_lines(r.fd, r.partial, lines, error);
      for (const std::string& line : lines) r.on_host_line(line);
      if (!open) {
        close(r.fd);
        r.fd = -1;
        r.fail_locally("lost the elastic rendezvous host at " + endpoint(r.o) +
                       (error == ETIMEDOUT ? " (" + silence(r.o) + ": this node is cut off from it, or it is down)"
                                           : std::string()) +
                       "; this node stops");
      }
    }
    return;
  }
  for (const pollfd& p : polled) {
    if (p.revents == 0) continue;
    if (p.fd == r.listen_fd) {
      r.accept_peers();
      continue;
    }
    // By index: handling a line may append peers (never here) or drop this one.
    for (std::size_t i = 1; i < r.peers.size(); ++i) {
      if (r.peers[i].fd != p.fd) continue;
      std::vector<std::string> lines;
      int error = 0;
      const bool open = read_lines(p.fd, r.peers[i].partial, lines, error);
      for (const std::string& line : lines) {
        if (r.peers[i].state != Impl::Peer::State::gone) r.on_peer_line(r.peers[i], line);
      }
      if (!open && r.peers[i].state != Impl::Peer::State::gone) r.on_peer_lost(r.peers[i], error);
      break;
    }
  }
  r.check_round();  // a deadline may have passed
}

std::optional<RendezvousEvent> Rendezvous::next_event() {
  if (impl_->events.empty()) return std::nullopt;
  RendezvousEvent e = std::move(impl_->events.front());
  impl_->events.pop_front();
  return e;
}

}  // namespace titan_run
