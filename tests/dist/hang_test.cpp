// SPDX-License-Identifier: BSD-3-Clause
// Hang detection by heartbeat: the finder on hand-made heartbeats, the blame a rank whose collective
// failed reads from them (in one process, through the flight recorder's hooks), and the bundled trainer under
// titan-run (2 FSDP ranks of the CPU debug model) where the test fault hang (TITAN_TEST_FAULTS=hang=1:3) puts rank 1 to
// sleep inside a collective: every rank names it and exits within comm.train_timeout_seconds + 10 s, and with
// --max-restarts the job restarts from its checkpoint and completes.
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

// The flight recorder's private hooks: the in-process test below drives them as ProcessGroup does.
#include "../../src/dist/flight_recorder_impl.hpp"
#include "../../src/dist/heartbeat_impl.hpp"
#include "dist/launch_test_util.hpp"
#include "titan/dist/flight_recorder.hpp"
#include "titan/dist/heartbeat.hpp"

namespace fs = std::filesystem;
using titan::dist::Heartbeat;
using titan::test::Subprocess;
using titan::test::TempDir;

namespace {

constexpr int64_t kSecond = 1'000'000;  // microseconds

Heartbeat beat(int64_t rank, int64_t step, std::string phase, int64_t wall_us, std::string waiting = "") {
  return Heartbeat{.rank = rank,
                   .step = step,
                   .phase = std::move(phase),
                   .progress = 7,
                   .wall_us = wall_us,
                   .waiting = std::move(waiting),
                   .timed = true,
                   .pid = 4200 + rank,
                   .host = "node" + std::to_string(rank)};
}

// The trainer flags of the hang runs: timeout `seconds`.
std::vector<std::string> job(const fs::path& dump, int steps, int seconds, const std::vector<std::string>& extra) {
  std::vector<std::string> flags = {"--comm.train_timeout_seconds", std::to_string(seconds)};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return titan::test::fsdp2_debug_job(dump.string(), steps, flags);
}

// A backend's work that the test fails by hand, as Gloo fails one whose receive timed out.
class FailingWork : public c10d::Work {
 public:
  void fail() { finish(std::make_exception_ptr(std::runtime_error("Timed out waiting 5000ms for recv operation"))); }
};

// Microseconds since the epoch, as heartbeats stamp them.
int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// This rank enters an all-reduce on `group` (as ProcessGroup::issue and Work::wait drive the flight recorder's
// hooks) and waits in it: the collective's id and the work the test fails by hand.
std::pair<int64_t, c10::intrusive_ptr<FailingWork>> wait_in_all_reduce(const std::string& group,
                                                                       const std::vector<int64_t>& ranks) {
  namespace detail = titan::dist::detail;
  const detail::TracedGroup traced{.name = group, .ranks = ranks};
  detail::before_collective(traced, "all_reduce");
  const int64_t id = detail::record_collective(traced, 1, "all_reduce", at::ones({4}));
  auto work = c10::make_intrusive<FailingWork>();
  detail::watch(id, work);
  detail::mark_started(id);
  return {id, work};
}

// True when a line of `output` starts with `prefix` and contains `text`.
bool has_line(const std::string& output, const std::string& prefix, const std::string& text) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with(prefix) && line.find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("Heartbeats round-trip and find_hung_ranks names the rank outside a collective", "[dist][heartbeat]") {
  const Heartbeat one = beat(1, 3, "data loading", 5 * kSecond);
  const Heartbeat back = titan::dist::decode_heartbeat(titan::dist::encode_heartbeat(one));
  CHECK(back.rank == 1);
  CHECK(back.step == 3);
  CHECK(back.phase == "data loading");
  CHECK(back.progress == 7);
  CHECK(back.wall_us == 5 * kSecond);
  CHECK(back.timed);
  CHECK(back.pid == 4201);
  CHECK(back.host == "node1");
  CHECK_THROWS_WITH(titan::dist::decode_heartbeat("{}"), Catch::Contains("expected a heartbeat record"));

  using std::chrono::seconds;
  const std::string waits = "all_reduce [1] Long (seq 9 on group 'dp_shard', ranks 0,1)";
  // Rank 0 waits for rank 1, which made no progress for 12 s: rank 1 is named, rank 0 is not.
  const std::vector<Heartbeat> beats = {beat(0, 3, "data loading", 6 * kSecond, waits), one};
  const auto hang = titan::dist::find_hung_ranks(beats, 17 * kSecond, seconds(10), seconds(10));
  REQUIRE(hang);
  CHECK_THAT(*hang, Catch::StartsWith("rank 1 made no progress for 12 s (last: step 3, data loading; pid 4201 on "
                                      "node1), while one rank waits in a collective (rank 0 in " +
                                      waits + ")"));
  CHECK_THAT(*hang, Catch::Contains("comm.train_timeout_seconds is 10 s"));
  CHECK_THAT(*hang, Catch::Contains("gdb -p 4201"));
  CHECK_THAT(*hang, !Catch::Contains("rank 0 made no progress"));
  // Not yet stale, not training yet (step 0), or in a phase the heartbeat does not time: no hang.
  CHECK_FALSE(titan::dist::find_hung_ranks(beats, 14 * kSecond, seconds(10), seconds(10)));
  CHECK_FALSE(titan::dist::find_hung_ranks({beat(1, 0, "starting", 0)}, 17 * kSecond, seconds(10), seconds(10)));
  Heartbeat saving = one;
  saving.timed = false;
  CHECK_FALSE(titan::dist::find_hung_ranks({saving}, 17 * kSecond, seconds(10), seconds(10)));
  // Only ranks waiting in collectives: their own collective timeout reports them, not the heartbeat.
  CHECK_FALSE(titan::dist::find_hung_ranks({beats[0]}, 60 * kSecond, seconds(10), seconds(10)));
}

TEST_CASE("find_silent_ranks names the ranks whose heartbeat stopped reaching the store by host", "[dist][heartbeat]") {
  using std::chrono::seconds;
  // Ranks 2 and 3 share a host whose heartbeats stopped 7 s ago; rank 1's stopped too, but it said it was
  // its last; rank 0's is fresh; a heartbeat without a publishing time (an older writer) is never silent.
  auto published = [](int64_t rank, const std::string& host, const std::string& addr, int64_t beat_us,
                      bool stopped = false) {
    Heartbeat b = beat(rank, 4, "forward/backward", beat_us);
    b.host = host;
    b.addr = addr;
    b.beat_us = beat_us;
    b.stopped = stopped;
    return b;
  };
  const std::vector<Heartbeat> beats = {
      published(0, "node0", "10.0.0.1", 20 * kSecond), published(1, "node0", "10.0.0.1", 10 * kSecond, true),
      published(2, "node1", "10.0.0.2", 13 * kSecond), published(3, "node1", "10.0.0.2", 13 * kSecond),
      beat(4, 4, "forward/backward", 1 * kSecond)};
  const Heartbeat back = titan::dist::decode_heartbeat(titan::dist::encode_heartbeat(beats[1]));
  CHECK(back.addr == "10.0.0.1");
  CHECK(back.beat_us == 10 * kSecond);
  CHECK(back.stopped);
  const auto silent =
      titan::dist::find_silent_ranks(beats, 20 * kSecond, seconds(5), seconds(5), "the store at 10.0.0.1:29500");
  REQUIRE(silent);
  CHECK_THAT(*silent,
             Catch::StartsWith("ranks 2, 3 on node1 (10.0.0.2) sent no heartbeat for 7 s (last: step 4, "
                               "forward/backward; pids 4202, 4203): that host is cut off from the store at "
                               "10.0.0.1:29500, or its processes are gone. comm.train_timeout_seconds is 5 s."));
  CHECK_THAT(*silent, !Catch::Contains("rank 1"));
  CHECK_THAT(*silent, !Catch::Contains("rank 4"));
  CHECK(titan::dist::detail::silent_summary(beats, 20 * kSecond, seconds(5), 0) ==
        "ranks 2, 3 on node1 (10.0.0.2) unreachable (no heartbeat for 7 s; detected by rank 0)");
  // Not silent long enough yet: nothing.
  CHECK_FALSE(
      titan::dist::find_silent_ranks(beats, 17 * kSecond, seconds(5), seconds(5), "the store at 10.0.0.1:29500"));
  // Two hosts: one part each, in rank order.
  std::vector<Heartbeat> two = beats;
  two[0].beat_us = 12 * kSecond;
  two[0].stopped = false;
  const auto both =
      titan::dist::find_silent_ranks(two, 20 * kSecond, seconds(5), seconds(5), "the store at 10.0.0.1:29500");
  REQUIRE(both);
  CHECK_THAT(*both, Catch::StartsWith("rank 0 on node0 (10.0.0.1) sent no heartbeat for 8 s (last: step 4, "
                                      "forward/backward; pid 4200); ranks 2, 3 on node1 (10.0.0.2) sent no heartbeat "
                                      "for 7 s"));
  CHECK_THAT(*both, Catch::Contains("those hosts are cut off from the store at 10.0.0.1:29500, or their processes"));
}

TEST_CASE("A rank whose collective just timed out still waits in it: the blame names only the rank outside one",
          "[dist][heartbeat]") {
  namespace detail = titan::dist::detail;
  using namespace std::chrono_literals;
  TempDir dir;
  // The backend's timeout fires first (the watchdog's own, 100 s, never does), as under load.
  titan::dist::enable_flight_recorder({.buffer_size = 8, .timeout = 100s, .folder = dir.path, .file_prefix = "rank_"});
  const auto store = c10::make_intrusive<c10d::HashStore>();
  detail::attach_store(store, 0, 2);
  // Rank 1 made no progress for a minute, outside any collective; its dump is in (stop_run waits for it).
  const int64_t now = now_us();
  const std::string asleep = titan::dist::encode_heartbeat(beat(1, 3, "data loading", now - 60 * kSecond));
  store->set(detail::heartbeat_key(1), std::vector<uint8_t>(asleep.begin(), asleep.end()));
  store->add("titan/flight_recorder/dumped", 1);

  // Rank 0 (this process) waits in an all-reduce, as ProcessGroup::issue and Work::wait drive the hooks.
  titan::dist::report_progress(3, "data loading");
  const auto [id, work] = wait_in_all_reduce("dp_shard", {0, 1});
  // The blame reads heartbeats idle for the wait less 2 s: wait long enough that rank 0's own is that old.
  std::this_thread::sleep_for(2500ms);
  work->fail();
  // The watchdog (every 100 ms) sees the failed work before the waiting thread reports it, as a loaded
  // machine orders them.
  std::this_thread::sleep_for(titan::test::patience(500ms));
  const std::string said = detail::mark_failed(id, "Timed out waiting 5000ms for recv operation");
  titan::dist::enable_flight_recorder({});      // off again for the other tests
  titan::dist::report_progress(0, "starting");  // and this process's heartbeat out of the collective
  CHECK_THAT(said, Catch::Contains("rank 1 made no progress for "));
  CHECK_THAT(said, Catch::Contains("while one rank waits in a collective (rank 0 in all_reduce [4] Float (seq 1 on "
                                   "group 'dp_shard', ranks 0,1))"));
  CHECK_THAT(said, !Catch::Contains("rank 0 made no progress"));
}

TEST_CASE("A failed collective's blame waits the second or two that names ranks whose heartbeat just stopped",
          "[dist][heartbeat]") {
  namespace detail = titan::dist::detail;
  using namespace std::chrono_literals;
  TempDir dir;
  titan::dist::enable_flight_recorder({.buffer_size = 8, .timeout = 100s, .folder = dir.path, .file_prefix = "rank_"});
  const auto store = c10::make_intrusive<c10d::HashStore>();
  detail::attach_store(store, 0, 3);
  // Ranks 1 and 2, on one host, waited in the collective and then missed a beat or two: their host was cut
  // off moments ago (while this rank already waited for them), so neither is silent for 3 s yet.
  const int64_t now = now_us();
  const std::string waits = "all_reduce [4] Float (seq 1 on group 'world', ranks 0,1,2)";
  for (const auto& [rank, quiet_us] : {std::pair<int64_t, int64_t>{1, 2 * kSecond}, {2, 1600'000}}) {
    Heartbeat b = beat(rank, 3, "forward/backward", now - 5 * kSecond, waits);
    b.host = "node1";
    b.addr = "10.0.0.2";
    b.beat_us = now - quiet_us;
    const std::string text = titan::dist::encode_heartbeat(b);
    store->set(detail::heartbeat_key(rank), std::vector<uint8_t>(text.begin(), text.end()));
  }

  titan::dist::report_progress(3, "forward/backward");
  const auto [id, work] = wait_in_all_reduce("world", {0, 1, 2});
  work->fail();
  const auto start = std::chrono::steady_clock::now();
  const std::string said = detail::mark_failed(id, "Timed out waiting 5000ms for recv operation");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  titan::dist::enable_flight_recorder({});
  titan::dist::report_progress(0, "starting");
  // Both are named, as silent, with their host; the blame waited for that (rank 2 needed 1.4 s more).
  CHECK_THAT(said, Catch::Contains("the run was stopped because: ranks 1, 2 on node1 (10.0.0.2) sent no heartbeat "
                                   "for "));
  CHECK_THAT(said, Catch::Contains(" s (last: step 3, forward/backward; pids 4201, 4202): that host is cut off from "
                                   "the store, or its processes are gone."));
  CHECK_THAT(said, Catch::Contains("(seen when rank 0 failed in all_reduce [4] Float"));
  CHECK(seconds >= 1.4);
  CHECK(seconds < titan::test::patience(5.0));
}

TEST_CASE("Hang: a rank asleep in a collective is named by every rank, which all exit within the timeout + 10 s",
          "[dist][launch][train][heartbeat][full]") {
  constexpr int kTimeout = 5;  // comm.train_timeout_seconds
  TempDir dump;
  Subprocess run(job(dump.path, 4, kTimeout, {}), {{"TITAN_TEST_FAULTS", "hang=1:3"}});
  REQUIRE(run.read_until(
      [](const std::string& out) { return out.find("test fault hang: rank 1 sleeps") != std::string::npos; }, 300));
  const auto slept = std::chrono::steady_clock::now();
  const auto status = run.wait(kTimeout + 60);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - slept).count();
  INFO(run.output());
  REQUIRE(status);
  CHECK(titan::test::exit_code(*status) != 0);
  CHECK(seconds <= kTimeout + titan::test::patience(10));
  // Both ranks' logs name rank 1, its step and phase, and say what to do.
  for (const std::string rank : {"[rank 0] ", "[rank 1] "}) {
    INFO(rank);
    CHECK(has_line(run.output(), rank, "rank 1 made no progress for"));
    CHECK(has_line(run.output(), rank, "(last: step 3, data loading; pid "));
    CHECK(has_line(run.output(), rank, "comm.train_timeout_seconds is 5 s"));
  }
  // titan-run names the hung rank (which rank 0 detected), not only the first rank that exited.
  CHECK(has_line(run.output(), "titan-run: rank 1 hung (no progress for ",
                 " s at step 3, data loading; detected by rank 0); rank "));
  // The flight recorder dumped on both ranks with that reason.
  for (int r = 0; r < 2; ++r) {
    const fs::path file = dump.path / "comm_traces" / ("rank_" + std::to_string(r) + ".json");
    REQUIRE(fs::exists(file));
    CHECK_THAT(titan::dist::read_trace(file).reason, Catch::StartsWith("rank 1 made no progress for"));
  }
  WARN("every rank exited " << seconds << " s after rank 1 fell asleep (timeout " << kTimeout << " s)");
}

TEST_CASE("Hang: with --max-restarts the job restarts from its checkpoint after a hung rank and completes",
          "[dist][launch][train][heartbeat][fault_tolerance][slow]") {
  TempDir dump;
  // Checkpoints at step 2; rank 1 falls asleep as step 4 starts (first attempt only).
  std::vector<std::string> args =
      job(dump.path, 5, 5,
          {"--checkpoint.enable", "true", "--checkpoint.interval", "2", "--checkpoint.last_save_model_only", "false"});
  args.insert(std::find(args.begin(), args.end(), "--"), {"--max-restarts", "1"});
  Subprocess run(args, {{"TITAN_TEST_FAULTS", "hang=1:4"}, {"TITAN_LOG_LEVEL", "info"}});
  titan::test::require_exit(run, 0, 180);
  INFO(run.output());
  CHECK_THAT(run.output(), Catch::Contains("rank 1 made no progress for"));
  CHECK_THAT(run.output(),
             Catch::Matches(R"([\s\S]*titan-run: restarting the job \(restart 1 of 1\) after rank 1 hung )"
                            R"([\s\S]*Resuming at step 3[\s\S]*Training completed at step 5[\s\S]*)"));
  const std::string log = titan::test::read_file(dump.path / "restarts.jsonl");
  REQUIRE(std::count(log.begin(), log.end(), '\n') == 1);
  const auto restart = nlohmann::json::parse(log.substr(0, log.find('\n')));
  CHECK(restart.at("restart_count") == 1);
  CHECK_THAT(restart.at("reason").get<std::string>(),
             Catch::Matches(R"(rank 1 hung \(no progress for \d+ s at step 4, data loading; detected by rank 0\); )"
                            R"(rank \d (exited with status|was killed).*)"));
  CHECK(restart.at("resume_step") == 3);
}
