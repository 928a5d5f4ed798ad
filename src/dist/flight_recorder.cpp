// SPDX-License-Identifier: BSD-3-Clause
// The flight recorder's ring, its JSON dumps, the mismatch finder titan-trace prints, and the process's
// recorder: the hooks ProcessGroup calls and the watchdog thread that times collectives, polls the
// store for another rank's stop request and publishes this rank's heartbeat (on rank 0 it also reads
// every rank's: src/dist/heartbeat.cpp finds the hung one).
#include "titan/dist/flight_recorder.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "deadline_store.hpp"
#include "flight_recorder_impl.hpp"
#include "heartbeat_impl.hpp"
#include "interface.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/test_faults.hpp"
#include "titan/dist/heartbeat.hpp"

namespace titan::dist {

std::string_view to_string(TraceState state) {
  switch (state) {
    case TraceState::kScheduled:
      return "scheduled";
    case TraceState::kStarted:
      return "started";
    case TraceState::kCompleted:
      return "completed";
    default:
      return "failed";
  }
}

namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TraceState state_from(const std::string& name) {
  for (TraceState s : {TraceState::kScheduled, TraceState::kStarted, TraceState::kCompleted, TraceState::kFailed}) {
    if (to_string(s) == name) return s;
  }
  TITAN_CHECK_VALUE(
      false, "[titan::dist::read_trace] expected a state (scheduled, started, completed, failed), got '{}'.", name);
  return TraceState::kFailed;
}

}  // namespace

FlightRecorder::FlightRecorder(int64_t capacity) {
  TITAN_CHECK_VALUE(capacity > 0, "[titan::dist::FlightRecorder] expected a capacity > 0, got {}.", capacity);
  ring_.resize(static_cast<size_t>(capacity));
}

int64_t FlightRecorder::record(TraceEntry entry) {
  std::lock_guard lock(mutex_);
  entry.id = next_id_++;
  ring_[static_cast<size_t>(entry.id % capacity())] = std::move(entry);
  return next_id_ - 1;
}

void FlightRecorder::update(int64_t id, TraceState state) {
  std::lock_guard lock(mutex_);
  if (id < 0 || id >= next_id_ || id < next_id_ - capacity()) return;  // overwritten
  TraceEntry& e = ring_[static_cast<size_t>(id % capacity())];
  if (state == TraceState::kStarted) {
    if (e.state != TraceState::kScheduled) return;  // completion raced ahead of the waiter
    e.started_us = now_us();
  } else {
    if (e.state == TraceState::kCompleted || e.state == TraceState::kFailed) return;
    e.completed_us = now_us();
  }
  e.state = state;
}

std::optional<TraceEntry> FlightRecorder::find(int64_t id) const {
  std::lock_guard lock(mutex_);
  if (id < 0 || id >= next_id_ || id < next_id_ - capacity()) return std::nullopt;
  return ring_[static_cast<size_t>(id % capacity())];
}

std::vector<TraceEntry> FlightRecorder::entries() const {
  std::lock_guard lock(mutex_);
  std::vector<TraceEntry> out;
  for (int64_t id = std::max<int64_t>(0, next_id_ - capacity()); id < next_id_; ++id)
    out.push_back(ring_[static_cast<size_t>(id % capacity())]);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Dumps

void write_trace(const RankTrace& trace, const std::filesystem::path& file) {
  nlohmann::json entries = nlohmann::json::array();
  for (const TraceEntry& e : trace.entries) {
    entries.push_back({{"id", e.id},
                       {"seq", e.seq},
                       {"group", e.group},
                       {"ranks", e.ranks},
                       {"op", e.op},
                       {"sizes", e.sizes},
                       {"dtype", e.dtype},
                       {"state", std::string(to_string(e.state))},
                       {"scheduled_us", e.scheduled_us},
                       {"started_us", e.started_us},
                       {"completed_us", e.completed_us}});
  }
  const nlohmann::json doc = {{"format", "titan-flight-recorder-1"},
                              {"rank", trace.rank},
                              {"world_size", trace.world_size},
                              {"reason", trace.reason},
                              {"entries", entries}};
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  const std::filesystem::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << doc.dump(1) << "\n";
    TITAN_CHECK(out.good(), "[titan::dist::write_trace] expected to write {}, got a write error.", tmp.string());
  }
  std::filesystem::rename(tmp, file);
}

RankTrace read_trace(const std::filesystem::path& file) {
  std::ifstream in(file);
  TITAN_CHECK_VALUE(in.good(), "[titan::dist::read_trace] expected a readable file, got {}.", file.string());
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    TITAN_CHECK_VALUE(false, "[titan::dist::read_trace] expected JSON in {}, got: {}", file.string(), e.what());
  }
  RankTrace trace{.rank = doc.at("rank").get<int64_t>(),
                  .world_size = doc.at("world_size").get<int64_t>(),
                  .reason = doc.at("reason").get<std::string>(),
                  .entries = {}};
  for (const auto& j : doc.at("entries")) {
    trace.entries.push_back(TraceEntry{.id = j.at("id").get<int64_t>(),
                                       .seq = j.at("seq").get<int64_t>(),
                                       .group = j.at("group").get<std::string>(),
                                       .ranks = j.at("ranks").get<std::vector<int64_t>>(),
                                       .op = j.at("op").get<std::string>(),
                                       .sizes = j.at("sizes").get<std::vector<int64_t>>(),
                                       .dtype = j.at("dtype").get<std::string>(),
                                       .state = state_from(j.at("state").get<std::string>()),
                                       .scheduled_us = j.at("scheduled_us").get<int64_t>(),
                                       .started_us = j.at("started_us").get<int64_t>(),
                                       .completed_us = j.at("completed_us").get<int64_t>()});
  }
  return trace;
}

std::vector<RankTrace> read_traces(const std::filesystem::path& folder) {
  TITAN_CHECK_VALUE(std::filesystem::is_directory(folder),
                    "[titan::dist::read_traces] expected a folder of flight-recorder dumps, got '{}'.",
                    folder.string());
  std::vector<RankTrace> out;
  for (const auto& item : std::filesystem::directory_iterator(folder)) {
    if (item.path().extension() == ".json") out.push_back(read_trace(item.path()));
  }
  std::sort(out.begin(), out.end(), [](const RankTrace& a, const RankTrace& b) { return a.rank < b.rank; });
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Mismatch finder

namespace {

std::string describe(const TraceEntry& e) {
  const bool done = e.state == TraceState::kCompleted;
  return fmt::format("{} [{}] {} ({}{})", e.op, fmt::join(e.sizes, ", "), e.dtype, to_string(e.state),
                     done ? "" : ", not completed");
}

bool same_call(const TraceEntry& a, const TraceEntry& b) {
  return a.op == b.op && a.sizes == b.sizes && a.dtype == b.dtype;
}

struct Finding {
  int64_t started_us = 0;  // when the disagreement began
  std::string text{};
};

// The first seq where the members of one group disagree.
std::optional<Finding> first_in_group(const std::string& group, const std::vector<int64_t>& ranks,
                                      const std::map<int64_t, std::map<int64_t, const TraceEntry*>>& by_rank) {
  int64_t lo = 1, hi = 0;
  for (const auto& [rank, seqs] : by_rank) {
    if (seqs.empty()) continue;
    lo = std::max(lo, seqs.begin()->first);  // older entries may be overwritten on some rank
    hi = std::max(hi, seqs.rbegin()->first);
  }
  const std::string where = fmt::format("group '{}' (ranks {})", group, fmt::join(ranks, ","));
  for (int64_t seq = lo; seq <= hi; ++seq) {
    std::vector<std::pair<int64_t, const TraceEntry*>> at;
    std::vector<int64_t> missing;
    for (const auto& [rank, seqs] : by_rank) {
      if (auto it = seqs.find(seq); it != seqs.end()) {
        at.emplace_back(rank, it->second);
      } else {
        missing.push_back(rank);
      }
    }
    int64_t first_us = INT64_MAX;
    for (const auto& [rank, e] : at) first_us = std::min(first_us, e->scheduled_us);
    std::vector<std::string> parts;
    if (!missing.empty()) {
      for (const auto& [rank, e] : at)
        parts.push_back(fmt::format("rank {} is at seq {}: {}", rank, seq, describe(*e)));
      for (int64_t rank : missing) {
        const auto& seqs = by_rank.at(rank);
        auto last = seqs.lower_bound(seq);
        if (last == seqs.begin()) {
          parts.push_back(
              fmt::format("rank {} never issued seq {} (nothing earlier on this group in its dump)", rank, seq));
        } else {
          --last;
          parts.push_back(fmt::format("rank {} is at seq {}: {} and never issued seq {}", rank, last->first,
                                      describe(*last->second), seq));
        }
      }
      return Finding{first_us, fmt::format("{} parts at seq {}: {}", where, seq, fmt::join(parts, "; "))};
    }
    const TraceEntry& ref = *at.front().second;
    bool differ = false;
    for (const auto& [rank, e] : at) differ = differ || !same_call(ref, *e);
    if (differ) {
      for (const auto& [rank, e] : at) parts.push_back(fmt::format("rank {} runs {}", rank, describe(*e)));
      return Finding{first_us, fmt::format("{} disagrees at seq {}: {}", where, seq, fmt::join(parts, "; "))};
    }
    std::vector<int64_t> stuck;
    for (const auto& [rank, e] : at) {
      if (e->state != TraceState::kCompleted) stuck.push_back(rank);
    }
    if (!stuck.empty()) {
      for (const auto& [rank, e] : at) parts.push_back(fmt::format("rank {} {}", rank, to_string(e->state)));
      return Finding{first_us,
                     fmt::format("{} seq {}: every rank issued {} [{}] {}, but it did not complete on rank(s) "
                                 "{} ({})",
                                 where, seq, ref.op, fmt::join(ref.sizes, ", "), ref.dtype, fmt::join(stuck, ","),
                                 fmt::join(parts, ", "))};
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> find_first_mismatch(const std::vector<RankTrace>& traces) {
  std::map<int64_t, const RankTrace*> dumped;
  for (const RankTrace& t : traces) dumped[t.rank] = &t;
  // group -> its ranks, and -> member rank with a dump -> seq -> entry
  std::map<std::string, std::vector<int64_t>> group_ranks;
  std::map<std::string, std::map<int64_t, std::map<int64_t, const TraceEntry*>>> groups;
  for (const RankTrace& t : traces) {
    for (const TraceEntry& e : t.entries) {
      group_ranks.emplace(e.group, e.ranks);
      groups[e.group][t.rank][e.seq] = &e;
    }
  }
  std::optional<Finding> first;
  for (const auto& [group, ranks] : group_ranks) {
    auto& by_rank = groups[group];
    for (int64_t r : ranks) {
      if (dumped.contains(r)) by_rank[r];  // a member with a dump but no entry on this group issued nothing
    }
    const auto found = first_in_group(group, ranks, by_rank);
    if (found && (!first || found->started_us < first->started_us)) first = found;
  }
  if (!first) return std::nullopt;
  return first->text;
}

// ---------------------------------------------------------------------------------------------------
// The process's recorder and its watchdog

namespace {

constexpr const char* kStopKey = "titan/flight_recorder/stop";
constexpr const char* kDumpedKey = "titan/flight_recorder/dumped";

struct Pending {
  c10::intrusive_ptr<c10d::Work> work{};
  std::chrono::steady_clock::time_point scheduled{};
};

struct Process {
  FlightRecorderOptions options{};
  std::unique_ptr<FlightRecorder> ring{};
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t skip_rank = -1;  // the test fault skip_collective
  int64_t skip_n = 0;
  std::atomic<int64_t> issued{0};

  std::mutex mutex{};      // guards pending and store
  std::mutex store_use{};  // held while the watchdog talks to the store (detach_flight_recorder_store waits)
  std::map<int64_t, Pending> pending{};
  // A connection of the recorder's own whose every call waits at most a few seconds (deadline_store.hpp):
  // the failure path must not hang on a store this host no longer reaches.
  detail::DeadlineStore store{};

  std::mutex stop_mutex{};  // guards reason
  std::condition_variable stop_cv{};
  std::string reason{};
  std::atomic<bool> stopped{false};
  std::once_flag dump_once{};

  std::atomic<bool> quit{false};
  std::mutex quit_mutex{};  // with quit_cv: the watchdog's pause between polls ends as soon as quit is set
  std::condition_variable quit_cv{};
  std::thread watchdog{};

  // heartbeat (watchdog thread only, but for the last one, which stop_run and detach publish)
  int64_t pid = 0;
  std::string host{};
  std::string addr{};              // the address this host reaches the store from
  bool store_unreachable = false;  // the watchdog said so; said again once it answers

  ~Process() {
    {
      const std::lock_guard lock(quit_mutex);
      quit = true;
    }
    quit_cv.notify_all();
    if (watchdog.joinable()) watchdog.join();
  }
};

std::unique_ptr<Process>& process_owner() {
  static std::unique_ptr<Process> process;
  return process;
}
std::atomic<Process*> g_process{nullptr};

std::string trace_file(const Process& p) {
  return (p.options.folder / fmt::format("{}{}.json", p.options.file_prefix, p.rank)).string();
}

std::string label(const Process& p, int64_t id) {
  const auto e = p.ring->find(id);
  if (!e) return fmt::format("collective #{}", id + 1);
  return fmt::format("{} [{}] {} (seq {} on group '{}', ranks {})", e->op, fmt::join(e->sizes, ", "), e->dtype, e->seq,
                     e->group, fmt::join(e->ranks, ","));
}

// This rank's heartbeat now. It waits in a collective when its training thread waits on one, or when
// one it issued is in flight for over a second: NCCL's wait() returns at once, and the host then
// blocks in a device sync behind the collective.
Heartbeat own_heartbeat(Process& p) {
  const detail::Progress now = detail::progress();
  std::string waiting = now.waiting_id >= 0 ? label(p, now.waiting_id) : std::string();
  std::lock_guard lock(p.mutex);
  if (waiting.empty()) {
    const auto cutoff = std::chrono::steady_clock::now() - std::chrono::seconds(1);
    for (const auto& [id, item] : p.pending) {  // oldest first
      if (item.scheduled < cutoff) {
        waiting = label(p, id) + ", in flight";
        break;
      }
    }
  }
  return Heartbeat{.rank = p.rank,
                   .step = now.step,
                   .phase = now.phase,
                   .progress = now.count,
                   .wall_us = now.wall_us,
                   .waiting = waiting,
                   .timed = now.timed,
                   .pid = p.pid,
                   .host = p.host,
                   .addr = p.addr,
                   .beat_us = now_us(),
                   .stopped = false};
}

// Sets this rank's heartbeat key, progress or not: its publishing time (beat_us) tells rank 0 that this
// rank still reaches the store. `last`: it stops publishing (its run stopped or ended), so its silence
// from now on means nothing.
void publish_heartbeat(Process& p, const detail::DeadlineStore& store, bool last = false) {
  Heartbeat beat = own_heartbeat(p);
  beat.stopped = last;
  store.set(detail::heartbeat_key(p.rank), encode_heartbeat(beat));
}

// Every rank's heartbeat in the store (this rank's as it is now); a rank that never published is left out.
std::vector<Heartbeat> read_heartbeats(Process& p, const detail::DeadlineStore& store) {
  std::vector<std::string> keys;
  for (int64_t r = 0; r < p.world_size; ++r) {
    if (r != p.rank) keys.push_back(detail::heartbeat_key(r));
  }
  std::vector<std::string> values;
  if (store.check(keys)) {
    values = store.multi_get(keys);
  } else {
    for (const std::string& key : keys) {
      if (store.check({key})) values.push_back(store.get(key));
    }
  }
  std::vector<Heartbeat> beats{own_heartbeat(p)};
  for (const auto& v : values) beats.push_back(decode_heartbeat(v));
  std::sort(beats.begin(), beats.end(), [](const Heartbeat& a, const Heartbeat& b) { return a.rank < b.rank; });
  return beats;
}

detail::DeadlineStore recorder_store(Process& p) {
  std::lock_guard lock(p.mutex);
  return p.store;
}

// After a failed collective, a rank whose heartbeat has not reached the store for this long is cut off or
// gone: it publishes about once a second, so 3 s of silence is no accident of load.
constexpr std::chrono::milliseconds kSilentAfterFailure = std::chrono::seconds(3);

// What the heartbeats show: the ranks silent for `silent` (their host cut off, or their process gone),
// then the ranks that made no progress for `stale`; or why the store could not say.
struct HeartbeatFinding {
  std::optional<std::string> culprits{};
  std::string store_error{};  // the store did not answer in time (this host may be the one cut off)
  // How long until every rank that has missed a beat or two is silent long enough to be named; zero when
  // none is on its way there.
  std::chrono::milliseconds going_quiet{0};
};

// A rank whose heartbeat is this old has missed a beat: on its way to silence, or only late under load.
constexpr std::chrono::milliseconds kMissedBeat = std::chrono::milliseconds(1500);

HeartbeatFinding find_hang(Process& p, std::chrono::milliseconds stale, std::chrono::milliseconds silent) {
  const detail::DeadlineStore store = recorder_store(p);
  if (!store) return {};
  try {
    const std::vector<Heartbeat> beats = read_heartbeats(p, store);
    const int64_t now = now_us();
    // Once one rank is silent that long, every rank silent for a few seconds is named with it: the ranks of
    // a host cut off went quiet within a second of each other, and pass the threshold one by one.
    const auto named = std::min(silent, kSilentAfterFailure);
    std::chrono::milliseconds going_quiet{0};
    for (const Heartbeat& b : beats) {
      const auto quiet = std::chrono::milliseconds((now - b.beat_us) / 1000);
      if (b.beat_us > 0 && !b.stopped && quiet >= kMissedBeat && quiet < named)
        going_quiet = std::max(going_quiet, named - quiet);
    }
    auto lost = find_silent_ranks(beats, now, silent, p.options.timeout, store.where());
    if (lost) lost = find_silent_ranks(beats, now, named, p.options.timeout, store.where());
    // A silent rank's last heartbeat is old news, and would read as no progress: it is not judged (and is
    // named as silent once silent long enough).
    std::vector<Heartbeat> heard;
    const int64_t named_us = std::chrono::duration_cast<std::chrono::microseconds>(named).count();
    for (const Heartbeat& b : beats) {
      if (b.beat_us <= 0 || b.stopped || now - b.beat_us < named_us) heard.push_back(b);
    }
    auto hang =
        stale > std::chrono::milliseconds(0) ? find_hung_ranks(heard, now, stale, p.options.timeout) : std::nullopt;
    if (!lost && !hang) return {.culprits = std::nullopt, .store_error = {}, .going_quiet = going_quiet};
    std::vector<std::string> summary;
    if (lost) summary.push_back(detail::silent_summary(beats, now, named, p.rank));
    if (hang) summary.push_back(detail::hang_summary(heard, now, stale, p.rank));
    detail::tell_launcher_of_hang(fmt::format("{}", fmt::join(summary, "; ")));
    return {.culprits = lost && hang ? fmt::format("{} Also: {}", *lost, *hang)
                        : lost       ? *lost
                                     : *hang,
            .store_error = {},
            .going_quiet = going_quiet};
  } catch (const detail::StoreUnreachable& e) {
    return {.culprits = std::nullopt, .store_error = e.what(), .going_quiet = {}};
  } catch (const std::exception& e) {
    log::warn("heartbeat: rank {} could not read the other ranks' heartbeats: {}", p.rank, error_message(e));
    return {};
  }
}

// A collective that waited `waited` failed or timed out: when the heartbeats show a rank silent for a few
// seconds, or one that made no progress for about as long as the wait (2 s for the once-a-second
// publishing), the reason names it first. When this rank cannot reach the store either, the reason says so.
std::string blame(Process& p, std::chrono::milliseconds waited, const std::string& reason) {
  HeartbeatFinding found = find_hang(p, waited - std::chrono::seconds(2), kSilentAfterFailure);
  if (found.going_quiet > std::chrono::milliseconds(0)) {
    // A host cut off while this rank already waited for it (it was behind) is not silent for long yet when
    // the collective times out: a second or two more tells a cut-off host from a late beat.
    std::this_thread::sleep_for(found.going_quiet + std::chrono::milliseconds(200));
    found = find_hang(p, waited - std::chrono::seconds(2), kSilentAfterFailure);
  }
  if (found.culprits) return fmt::format("{} (seen when {})", *found.culprits, reason);
  if (!found.store_error.empty()) {  // one sentence within the caller's: no full stop of its own
    std::string error = found.store_error;
    while (!error.empty() && error.back() == '.') error.pop_back();
    return fmt::format("{}; {}", reason, error);
  }
  return reason;
}

// Dumps this rank's ring once. The rank that detected the failure (local) then tells the others
// through the store (after its own dump: the launcher stops every rank once one exits) and waits (a
// few seconds at most) until they dumped too: rank 0 serves the store, so it must not leave before the
// others read the request.
void stop_run(Process& p, const std::string& reason, bool local) {
  std::call_once(p.dump_once, [&] {
    {
      std::lock_guard lock(p.stop_mutex);
      p.reason = reason;
    }
    const detail::DeadlineStore store = recorder_store(p);
    try {
      write_trace({.rank = p.rank, .world_size = p.world_size, .reason = reason, .entries = p.ring->entries()},
                  trace_file(p));
      log::error("flight recorder: rank {} dumped {} collectives to {} ({})", p.rank, p.ring->entries().size(),
                 trace_file(p), reason);
    } catch (const std::exception& e) {
      log::error("flight recorder: rank {} could not write {}: {}", p.rank, trace_file(p), error_message(e));
    }
    if (local && store) {
      try {
        store.set(kStopKey, reason);
      } catch (const std::exception& e) {
        log::error("flight recorder: could not ask the other ranks to dump: {}", error_message(e));
      }
    }
    if (store) {
      try {
        // This rank's silence from now on is no news: it stopped.
        publish_heartbeat(p, store, /*last=*/true);
        store.add(kDumpedKey, 1);
        // A rank silent for a few seconds (its host cut off) cannot dump through the store: waiting for it
        // would only hold this one back.
        int64_t expected = p.world_size;
        if (local) {
          const int64_t now = now_us();
          const int64_t silent_us = std::chrono::duration_cast<std::chrono::microseconds>(kSilentAfterFailure).count();
          for (const Heartbeat& b : read_heartbeats(p, store)) {
            if (b.beat_us > 0 && !b.stopped && now - b.beat_us >= silent_us) --expected;
          }
        }
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (local && store.add(kDumpedKey, 0) < expected && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
      } catch (const std::exception&) {
        // the store's server (rank 0) is gone, or out of reach: nobody left to wait for
      }
    }
    p.stopped = true;
    p.stop_cv.notify_all();
  });
}

std::string stop_reason(Process& p) {
  std::lock_guard lock(p.stop_mutex);
  return p.reason;
}

// kCompleted or kFailed once the work finished (by isCompleted(), or its future where it has one). A work
// that reports neither (Gloo's reduce-scatter) is marked complete when its wait() returns.
std::optional<TraceState> finished(const c10::intrusive_ptr<c10d::Work>& work) {
  if (work->isCompleted()) return work->exception() ? TraceState::kFailed : TraceState::kCompleted;
  try {
    const auto future = work->getFuture();
    if (future && future->completed()) return future->hasError() ? TraceState::kFailed : TraceState::kCompleted;
  } catch (const std::exception&) {
    // a backend whose work has no future
  }
  return std::nullopt;
}

void watchdog_loop(Process* p) {
  auto last_poll = std::chrono::steady_clock::now();
  auto last_beat = last_poll;
  // About once a second; more often under a short timeout.
  const auto beat_period = std::min<std::chrono::milliseconds>(std::chrono::seconds(1), p->options.timeout / 5);
  while (true) {
    {
      // Woken by quit: every process that ends joins this thread, and a plain sleep made each wait up to 100 ms.
      std::unique_lock lock(p->quit_mutex);
      if (p->quit_cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return p->quit.load(); })) break;
    }
    if (p->stopped) continue;
    const auto now = std::chrono::steady_clock::now();
    // Weak references: a strong copy would keep a work that its rank has meanwhile waited for (and so its
    // tensors: an FSDP unit's gathered weights, a state-passing message) alive until this scan and the store
    // talk below are over, past the point where the training thread released them.
    struct Watched {
      int64_t id = 0;
      c10::weak_intrusive_ptr<c10d::Work> work;
      std::chrono::steady_clock::time_point scheduled{};
    };
    std::vector<Watched> pending;
    {
      std::lock_guard lock(p->mutex);
      for (const auto& [id, item] : p->pending)
        pending.push_back({id, c10::weak_intrusive_ptr<c10d::Work>(item.work), item.scheduled});
    }
    for (const Watched& item : pending) {
      const int64_t id = item.id;
      const c10::intrusive_ptr<c10d::Work> work = item.work.lock();
      if (!work) continue;  // waited for and released since the copy
      if (const auto state = finished(work)) {
        p->ring->update(id, *state);
        // A failed one keeps the training thread inside it until its wait() throws and stops the run:
        // cleared here, that rank's heartbeat would read idle since the wait began, and the blame for the
        // failure (which reads it) would name the rank that merely waited.
        if (*state == TraceState::kCompleted) detail::collective_done(id);
        std::lock_guard lock(p->mutex);
        p->pending.erase(id);
      } else if (now - item.scheduled > p->options.timeout) {
        const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(p->options.timeout).count();
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - item.scheduled);
        stop_run(*p,
                 blame(*p, waited,
                       fmt::format("rank {} timed out after {} s (comm.train_timeout_seconds) in {}", p->rank, seconds,
                                   label(*p, id))),
                 true);
        break;
      }
    }
    const std::lock_guard use(p->store_use);
    const detail::DeadlineStore store = recorder_store(*p);  // detached meanwhile: the run is over
    // A store this host no longer reaches is said once (and again should it come back); the rank goes on:
    // its next collective with a rank out of reach fails within the timeout, and the failure path, whose
    // store calls wait no longer than these, names the store.
    auto unreachable = [&](const std::exception& e) {
      if (dynamic_cast<const detail::StoreUnreachable*>(&e) == nullptr || p->store_unreachable) return;
      p->store_unreachable = true;
      log::error(
          "flight recorder: rank {}: {} Its collectives with the other hosts fail within comm.train_timeout_seconds "
          "({} s).",
          p->rank, e.what(), std::chrono::duration_cast<std::chrono::seconds>(p->options.timeout).count());
    };
    auto reachable = [&] {
      if (!p->store_unreachable) return;
      p->store_unreachable = false;
      log::info_all("flight recorder: rank {} reaches {} again", p->rank, store.where());
    };
    if (store && !p->stopped && now - last_beat >= beat_period) {
      last_beat = now;
      try {
        publish_heartbeat(*p, store);
        reachable();
      } catch (const std::exception& e) {
        unreachable(e);  // else the store's server is gone: this rank's own collectives fail on their own
      }
      // Rank 0 (whose process serves the store) reads every rank's heartbeat: a rank without progress for
      // the collective timeout stops the run, and so does one silent for twice as long. A host cut off is
      // named sooner by the collectives it blocks (their blame reads the heartbeats), and one back from a
      // short outage may take a few seconds of TCP retransmission to be heard again: its collectives may
      // have recovered, and it must not be stopped for that.
      if (p->rank == 0 && !store.unreachable()) {
        const HeartbeatFinding found = find_hang(*p, p->options.timeout, 2 * p->options.timeout);
        if (found.culprits) stop_run(*p, *found.culprits, true);
      }
    }
    if (store && !p->stopped && now - last_poll > std::chrono::milliseconds(500)) {
      last_poll = now;
      try {
        if (store.check({kStopKey})) stop_run(*p, store.get(kStopKey), false);
        reachable();
      } catch (const std::exception& e) {
        unreachable(e);  // else the store's server is gone: this rank's own collectives fail on their own
      }
    }
  }
}

Process* process() { return g_process.load(std::memory_order_acquire); }

}  // namespace

void detach_flight_recorder_store() {
  Process* p = process();
  if (!p) return;
  const std::lock_guard use(p->store_use);
  const detail::DeadlineStore store = recorder_store(*p);
  if (store && !p->stopped) {
    try {
      publish_heartbeat(*p, store, /*last=*/true);  // its silence from now on is the run's end
    } catch (const std::exception&) {
      // out of reach or gone: the others are past caring
    }
  }
  std::lock_guard lock(p->mutex);
  p->store = {};
}

void enable_flight_recorder(const FlightRecorderOptions& options) {
  g_process.store(nullptr, std::memory_order_release);
  process_owner().reset();  // joins the previous watchdog
  if (options.buffer_size <= 0) return;
  auto p = std::make_unique<Process>();
  p->options = options;
  p->ring = std::make_unique<FlightRecorder>(options.buffer_size);
  if (const char* rank = std::getenv("RANK")) p->rank = std::atoll(rank);
  if (const char* world = std::getenv("WORLD_SIZE")) p->world_size = std::atoll(world);
  p->pid = static_cast<int64_t>(getpid());
  p->host = detail::host_name();
  if (const auto skip = testing::faults().skip_collective) {
    p->skip_rank = skip->rank;
    p->skip_n = skip->at;
  }
  p->watchdog = std::thread(watchdog_loop, p.get());
  g_process.store(p.get(), std::memory_order_release);
  process_owner() = std::move(p);
}

namespace detail {

bool recorder_enabled() { return process() != nullptr; }

void before_collective(const TracedGroup& group, const char* op) {
  Process& p = *process();
  TITAN_CHECK(!p.stopped,
              "[titan::dist] expected no collective after the flight recorder stopped the run, got {} on group "
              "'{}'. Stopped because: {}. Traces: {}",
              op, group.name, stop_reason(p), p.options.folder.string());
  const int64_t n = ++p.issued;
  if (detail::take_test_hang()) {
    const int64_t step = detail::progress().step;
    log::error("test fault hang: rank {} sleeps in its collective #{} ({} on group '{}') at step {}", p.rank, n, op,
               group.name, step);
    std::this_thread::sleep_for(10 * p.options.timeout);
    TITAN_CHECK(false,
                "[titan::dist] rank {} slept {} s in its collective #{} at step {} (test fault hang) and "
                "was not stopped. Run it under titan-run, which stops every rank once one fails.",
                p.rank, std::chrono::duration_cast<std::chrono::seconds>(10 * p.options.timeout).count(), n, step);
  }
  detail::note_progress(-1);  // reaching a collective is progress
  if (p.rank != p.skip_rank || n != p.skip_n) return;
  log::error("test fault skip_collective: rank {} skips its collective #{} ({} on group '{}') and waits", p.rank, n, op,
             group.name);
  std::unique_lock lock(p.stop_mutex);
  p.stop_cv.wait_for(lock, 10 * p.options.timeout, [&] { return p.stopped.load(); });
  TITAN_CHECK(false,
              "[titan::dist] rank {} stopped at its collective #{} ({} on group '{}', skipped by "
              "the test fault skip_collective): {}. Traces: {}; run titan-trace on that folder.",
              p.rank, n, op, group.name, p.reason.empty() ? "no other rank stopped the run" : p.reason,
              p.options.folder.string());
}

int64_t record_collective(const TracedGroup& group, int64_t seq, const char* op, const at::Tensor& input) {
  Process& p = *process();
  TraceEntry entry{.id = 0,
                   .seq = seq,
                   .group = group.name,
                   .ranks = group.ranks,
                   .op = op,
                   .sizes = input.defined() ? input.sizes().vec() : std::vector<int64_t>{},
                   .dtype = input.defined() ? std::string(c10::toString(input.scalar_type())) : std::string(),
                   .state = TraceState::kScheduled,
                   .scheduled_us = now_us(),
                   .started_us = 0,
                   .completed_us = 0};
  return p.ring->record(std::move(entry));
}

void watch(int64_t id, const c10::intrusive_ptr<c10d::Work>& work) {
  Process* p = process();
  if (!p || id < 0) return;
  std::lock_guard lock(p->mutex);
  p->pending[id] = Pending{.work = work, .scheduled = std::chrono::steady_clock::now()};
}

void mark_started(int64_t id) {
  if (Process* p = process(); p && id >= 0) {
    p->ring->update(id, TraceState::kStarted);
    note_progress(id);
  }
}

void mark_completed(int64_t id) {
  Process* p = process();
  if (!p || id < 0) return;
  p->ring->update(id, TraceState::kCompleted);
  note_progress(-1);
  std::lock_guard lock(p->mutex);
  p->pending.erase(id);
}

std::string mark_failed(int64_t id, const std::string& what) {
  Process* p = process();
  if (!p || id < 0) return "";
  p->ring->update(id, TraceState::kFailed);
  {
    std::lock_guard lock(p->mutex);
    p->pending.erase(id);
  }
  const auto entry = p->ring->find(id);
  const auto waited = std::chrono::milliseconds(entry ? (now_us() - entry->scheduled_us) / 1000 : 0);
  stop_run(*p, blame(*p, waited, fmt::format("rank {} failed in {}: {}", p->rank, label(*p, id), what)), true);
  return fmt::format(
      " Rank {} is stuck in {}; the run was stopped because: {}. Every rank dumped its flight recorder "
      "to {}: run titan-trace on that folder to see where the ranks parted.",
      p->rank, label(*p, id), stop_reason(*p), p->options.folder.string());
}

void attach_store(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world_size) {
  Process* p = process();
  if (!p) return;
  const auto deadline = store_deadline(p->options.timeout);
  DeadlineStore bounded;
  try {
    bounded = DeadlineStore::own_connection(store, deadline);
  } catch (const std::exception& e) {
    log::warn("flight recorder: rank {} shares the launch store's connection (its own failed: {})", rank,
              error_message(e));
    bounded = DeadlineStore(store, store_name(store), deadline);
  }
  // Where the other hosts reach this one (Gloo binds the same address unless GLOO_SOCKET_IFNAME says
  // otherwise): the heartbeat names it, since hosts often share a name (containers, namespaces).
  std::string addr;
  if (const std::string host = store_host(store); !host.empty()) {
    try {
      addr = local_address_towards(host);
    } catch (const std::exception&) {
      // no route: the store could not have been reached either; the host name alone
    }
  }
  std::lock_guard lock(p->mutex);
  p->store = std::move(bounded);
  p->addr = std::move(addr);
  p->rank = rank;
  p->world_size = world_size;
}

}  // namespace detail
}  // namespace titan::dist
