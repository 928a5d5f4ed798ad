// SPDX-License-Identifier: BSD-3-Clause
// The heartbeat's process state (what the training thread last did), its wire format, and the finder
// that reads a hang out of every rank's heartbeat. The watchdog thread that publishes and reads
// heartbeats is the flight recorder's (src/dist/flight_recorder.cpp).
#include "titan/dist/heartbeat.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "heartbeat_impl.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"

namespace titan::dist {

namespace {

int64_t wall_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct State {
  std::mutex mutex{};
  detail::Progress progress{.step = 0, .phase = "starting", .timed = true, .count = 0, .wall_us = 0, .waiting_id = -1};
  std::atomic<bool> hang{false};
};

State& state() {
  static State s;
  return s;
}

}  // namespace

void report_progress(int64_t step, std::string_view phase, bool timed) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.progress.step = step;
  s.progress.phase = std::string(phase);
  s.progress.timed = timed;
  ++s.progress.count;
  s.progress.wall_us = wall_now_us();
  s.progress.waiting_id = -1;
}

void hang_in_next_collective_for_test() { state().hang = true; }

std::string encode_heartbeat(const Heartbeat& beat) {
  return nlohmann::json{{"rank", beat.rank},         {"step", beat.step},       {"phase", beat.phase},
                        {"progress", beat.progress}, {"wall_us", beat.wall_us}, {"waiting", beat.waiting},
                        {"timed", beat.timed},       {"pid", beat.pid},         {"host", beat.host},
                        {"addr", beat.addr},         {"beat_us", beat.beat_us}, {"stopped", beat.stopped}}
      .dump();
}

Heartbeat decode_heartbeat(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
    return Heartbeat{.rank = j.at("rank").get<int64_t>(),
                     .step = j.at("step").get<int64_t>(),
                     .phase = j.at("phase").get<std::string>(),
                     .progress = j.at("progress").get<int64_t>(),
                     .wall_us = j.at("wall_us").get<int64_t>(),
                     .waiting = j.at("waiting").get<std::string>(),
                     .timed = j.at("timed").get<bool>(),
                     .pid = j.at("pid").get<int64_t>(),
                     .host = j.at("host").get<std::string>(),
                     // Absent from a heartbeat written by hand (tests): unknown, never silent.
                     .addr = j.value("addr", std::string()),
                     .beat_us = j.value("beat_us", int64_t{0}),
                     .stopped = j.value("stopped", false)};
  } catch (const std::exception& e) {
    TITAN_CHECK_VALUE(false, "[titan::dist::decode_heartbeat] expected a heartbeat record (JSON), got '{}': {}", text,
                      e.what());
  }
  return {};
}

namespace {

// The ranks in `beats` that are training, in a timed phase, not waiting in a collective and made no
// progress for `stale`; and the ranks waiting in a collective.
struct Hang {
  std::vector<const Heartbeat*> hung{};
  std::vector<const Heartbeat*> waiting{};
};

Hang classify(const std::vector<Heartbeat>& beats, int64_t now_us, std::chrono::milliseconds stale) {
  const int64_t stale_us = std::chrono::duration_cast<std::chrono::microseconds>(stale).count();
  Hang h;
  for (const Heartbeat& b : beats) {
    if (!b.waiting.empty()) {
      h.waiting.push_back(&b);
    } else if (b.step >= 1 && b.timed && now_us - b.wall_us >= stale_us) {
      h.hung.push_back(&b);
    }
  }
  return h;
}

int64_t idle_seconds(const Heartbeat& b, int64_t now_us) { return (now_us - b.wall_us + 500'000) / 1'000'000; }

int64_t silent_seconds(const Heartbeat& b, int64_t now_us) { return (now_us - b.beat_us + 500'000) / 1'000'000; }

// "node1 (10.0.0.2)", or the host name alone when the address is unknown.
std::string where(const Heartbeat& b) { return b.addr.empty() ? b.host : fmt::format("{} ({})", b.host, b.addr); }

// The silent ranks (a heartbeat published, not the last, none since `silent`), grouped by host in rank order.
std::vector<std::vector<const Heartbeat*>> silent_by_host(const std::vector<Heartbeat>& beats, int64_t now_us,
                                                          std::chrono::milliseconds silent) {
  const int64_t silent_us = std::chrono::duration_cast<std::chrono::microseconds>(silent).count();
  std::vector<std::vector<const Heartbeat*>> hosts;
  for (const Heartbeat& b : beats) {
    if (b.beat_us <= 0 || b.stopped || now_us - b.beat_us < silent_us) continue;
    auto same = std::find_if(hosts.begin(), hosts.end(), [&](const auto& h) { return where(*h.front()) == where(b); });
    if (same == hosts.end()) {
      hosts.push_back({&b});
    } else {
      same->push_back(&b);
    }
  }
  return hosts;
}

// "rank 2" or "ranks 2, 3".
std::string rank_list(const std::vector<const Heartbeat*>& group) {
  std::vector<int64_t> ranks;
  for (const Heartbeat* b : group) ranks.push_back(b->rank);
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

std::optional<std::string> find_hung_ranks(const std::vector<Heartbeat>& beats, int64_t now_us,
                                           std::chrono::milliseconds stale, std::chrono::milliseconds timeout) {
  const auto [hung, waiting] = classify(beats, now_us, stale);
  if (hung.empty()) return std::nullopt;
  std::vector<std::string> parts;
  for (const Heartbeat* b : hung) {
    parts.push_back(fmt::format("rank {} made no progress for {} s (last: step {}, {}; pid {} on {})", b->rank,
                                idle_seconds(*b, now_us), b->step, b->phase, b->pid, where(*b)));
  }
  std::string text = fmt::format("{}", fmt::join(parts, "; "));
  if (!waiting.empty()) {
    std::vector<std::string> waits;
    for (size_t i = 0; i < waiting.size() && i < 4; ++i)
      waits.push_back(fmt::format("rank {} in {}", waiting[i]->rank, waiting[i]->waiting));
    if (waiting.size() > 4) waits.push_back(fmt::format("{} more", waiting.size() - 4));
    text += fmt::format(", while {} wait{} in a collective ({})", waiting.size() == 1 ? "one rank" : "ranks",
                        waiting.size() == 1 ? "s" : "", fmt::join(waits, "; "));
  }
  const Heartbeat& first = *hung.front();
  text += fmt::format(
      ". comm.train_timeout_seconds is {} s. To see where it is stuck, attach to it before the launcher stops it "
      "(on {}: gdb -p {} -batch -ex 'thread apply all bt'); if step {}'s {} legitimately takes longer, raise "
      "comm.train_timeout_seconds. Under titan-run --max-restarts the job restarts from the newest checkpoint.",
      std::chrono::duration_cast<std::chrono::seconds>(timeout).count(), first.host, first.pid, first.step,
      first.phase);
  return text;
}

std::optional<std::string> find_silent_ranks(const std::vector<Heartbeat>& beats, int64_t now_us,
                                             std::chrono::milliseconds silent, std::chrono::milliseconds timeout,
                                             const std::string& store) {
  const auto hosts = silent_by_host(beats, now_us, silent);
  if (hosts.empty()) return std::nullopt;
  std::vector<std::string> parts;
  for (const auto& group : hosts) {
    std::vector<int64_t> pids;
    int64_t longest = 0;
    for (const Heartbeat* b : group) {
      pids.push_back(b->pid);
      longest = std::max(longest, silent_seconds(*b, now_us));
    }
    const Heartbeat& first = *group.front();
    parts.push_back(fmt::format("{} on {} sent no heartbeat for {} s (last: step {}, {}; pid{} {})", rank_list(group),
                                where(first), longest, first.step, first.phase, pids.size() == 1 ? "" : "s",
                                fmt::join(pids, ", ")));
  }
  return fmt::format(
      "{}: {} cut off from {}, or {} processes are gone. comm.train_timeout_seconds is {} s. Check "
      "that host and the network between it and the others (a link down, a firewall, a switch); under titan-run "
      "--max-restarts the job restarts from the newest checkpoint, and an elastic job (--nnodes MIN:MAX) goes on "
      "without that host.",
      fmt::join(parts, "; "), hosts.size() == 1 ? "that host is" : "those hosts are", store,
      hosts.size() == 1 ? "its" : "their", std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
}

namespace detail {

Progress progress() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.progress;
}

void note_progress(int64_t waiting_id) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  ++s.progress.count;
  s.progress.wall_us = wall_now_us();
  s.progress.waiting_id = waiting_id;
}

void collective_done(int64_t id) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (s.progress.waiting_id != id) return;
  // Leaving the wait is progress: the rank must not read as idle since the wait began.
  ++s.progress.count;
  s.progress.wall_us = wall_now_us();
  s.progress.waiting_id = -1;
}

bool take_test_hang() { return state().hang.exchange(false); }

std::string hang_summary(const std::vector<Heartbeat>& beats, int64_t now_us, std::chrono::milliseconds stale,
                         int64_t detected_by) {
  std::vector<std::string> parts;
  for (const Heartbeat* b : classify(beats, now_us, stale).hung) {
    parts.push_back(fmt::format("rank {} hung (no progress for {} s at step {}, {}; detected by rank {})", b->rank,
                                idle_seconds(*b, now_us), b->step, b->phase, detected_by));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::string silent_summary(const std::vector<Heartbeat>& beats, int64_t now_us, std::chrono::milliseconds silent,
                           int64_t detected_by) {
  std::vector<std::string> parts;
  for (const auto& group : silent_by_host(beats, now_us, silent)) {
    int64_t longest = 0;
    for (const Heartbeat* b : group) longest = std::max(longest, silent_seconds(*b, now_us));
    parts.push_back(fmt::format("{} on {} unreachable (no heartbeat for {} s; detected by rank {})", rank_list(group),
                                where(*group.front()), longest, detected_by));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

void tell_launcher_of_hang(const std::string& summary) {
  const char* path = std::getenv("TITAN_RUN_HANG_FILE");
  if (path == nullptr || *path == '\0' || summary.empty()) return;
  // Written aside and renamed: the launcher reads it after the ranks exited, but never half a line.
  const std::string tmp = fmt::format("{}.{}", path, getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << summary << '\n';
    if (!out) {
      log::warn("heartbeat: could not write {} for titan-run", tmp);
      return;
    }
  }
  if (std::rename(tmp.c_str(), path) != 0) log::warn("heartbeat: could not rename {} to {}", tmp, path);
}

std::string heartbeat_key(int64_t rank) { return fmt::format("titan/heartbeat/{}", rank); }

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace detail
}  // namespace titan::dist
