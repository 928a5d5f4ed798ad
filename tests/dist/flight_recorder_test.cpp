// SPDX-License-Identifier: BSD-3-Clause
// The flight recorder: its ring buffer, dumps that read back, the mismatch finder on hand-made traces,
// and the hang run: under titan-run one rank skips a collective (TITAN_TEST_FAULTS=skip_collective=1:12),
// every rank exits within comm.train_timeout_seconds + 10 s with an error naming the collective, every
// rank dumped its ring, and titan-trace names the rank that never issued it. The watchdog itself is
// tested with ranks as threads.
#include <fmt/format.h>

#include <chrono>
#include <regex>
#include <thread>

#include "dist/launch_test_util.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/flight_recorder.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/process_group.hpp"

namespace fs = std::filesystem;
using titan::dist::FlightRecorder;
using titan::dist::RankTrace;
using titan::dist::TraceEntry;
using titan::dist::TraceState;
using titan::test::Subprocess;
using titan::test::TempDir;

namespace {

TraceEntry entry(int64_t seq, std::string op, TraceState state, int64_t at_us, std::vector<int64_t> sizes = {4}) {
  return TraceEntry{.id = 0,
                    .seq = seq,
                    .group = "world",
                    .ranks = {0, 1},
                    .op = std::move(op),
                    .sizes = std::move(sizes),
                    .dtype = "Float",
                    .state = state,
                    .scheduled_us = at_us,
                    .started_us = 0,
                    .completed_us = 0};
}

}  // namespace

TEST_CASE("FlightRecorder keeps the newest entries in order and updates states", "[dist][flight_recorder]") {
  FlightRecorder ring(3);
  for (int64_t seq = 1; seq <= 5; ++seq)
    CHECK(ring.record(entry(seq, "all_reduce", TraceState::kScheduled, seq)) == seq - 1);
  const auto entries = ring.entries();
  REQUIRE(entries.size() == 3);
  CHECK(entries[0].seq == 3);
  CHECK(entries[0].id == 2);
  CHECK(entries[2].seq == 5);
  ring.update(4, TraceState::kStarted);
  CHECK(ring.find(4)->state == TraceState::kStarted);
  CHECK(ring.find(4)->started_us > 0);
  ring.update(4, TraceState::kCompleted);
  CHECK(ring.find(4)->state == TraceState::kCompleted);
  ring.update(4, TraceState::kStarted);  // a late waiter does not move a completed entry back
  CHECK(ring.find(4)->state == TraceState::kCompleted);
  ring.update(0, TraceState::kCompleted);  // overwritten: ignored
  CHECK_FALSE(ring.find(0).has_value());
  CHECK_THROWS(FlightRecorder(0));
}

TEST_CASE("Flight-recorder dumps read back entry for entry", "[dist][flight_recorder]") {
  TempDir dir;
  RankTrace trace{.rank = 1, .world_size = 2, .reason = "test", .entries = {}};
  trace.entries.push_back(entry(1, "all_gather", TraceState::kCompleted, 10, {2, 3}));
  trace.entries.push_back(entry(2, "barrier", TraceState::kStarted, 20, {}));
  titan::dist::write_trace(trace, dir.path / "rank_1.json");
  const auto back = titan::dist::read_traces(dir.path);
  REQUIRE(back.size() == 1);
  CHECK(back[0].rank == 1);
  CHECK(back[0].reason == "test");
  REQUIRE(back[0].entries.size() == 2);
  CHECK(back[0].entries[0].sizes == std::vector<int64_t>{2, 3});
  CHECK(back[0].entries[1].op == "barrier");
  CHECK(back[0].entries[1].state == TraceState::kStarted);
}

TEST_CASE("find_first_mismatch names the rank that never issued a collective", "[dist][flight_recorder]") {
  RankTrace r0{.rank = 0, .world_size = 2, .reason = "", .entries = {}};
  RankTrace r1{.rank = 1, .world_size = 2, .reason = "", .entries = {}};
  for (int64_t seq = 1; seq <= 2; ++seq) {
    r0.entries.push_back(entry(seq, "all_reduce", TraceState::kCompleted, seq));
    r1.entries.push_back(entry(seq, "all_reduce", TraceState::kCompleted, seq));
  }
  CHECK_FALSE(titan::dist::find_first_mismatch({r0, r1}).has_value());
  r0.entries.push_back(entry(3, "all_gather", TraceState::kStarted, 3));
  const auto found = titan::dist::find_first_mismatch({r0, r1});
  REQUIRE(found.has_value());
  CHECK_THAT(*found, Catch::Contains("group 'world' (ranks 0,1) parts at seq 3"));
  CHECK_THAT(*found, Catch::Contains("rank 0 is at seq 3: all_gather [4] Float (started, not completed)"));
  CHECK_THAT(*found, Catch::Contains("rank 1 is at seq 2: all_reduce [4] Float (completed) and never issued seq 3"));
}

TEST_CASE("find_first_mismatch names different collectives at one seq and stuck ones", "[dist][flight_recorder]") {
  RankTrace r0{.rank = 0, .world_size = 2, .reason = "", .entries = {entry(1, "all_reduce", TraceState::kStarted, 5)}};
  RankTrace r1{.rank = 1, .world_size = 2, .reason = "", .entries = {entry(1, "broadcast", TraceState::kStarted, 6)}};
  auto found = titan::dist::find_first_mismatch({r0, r1});
  REQUIRE(found.has_value());
  CHECK_THAT(*found, Catch::Contains("disagrees at seq 1: rank 0 runs all_reduce [4] Float"));
  CHECK_THAT(*found, Catch::Contains("rank 1 runs broadcast"));
  r1.entries = {entry(1, "all_reduce", TraceState::kCompleted, 6)};
  found = titan::dist::find_first_mismatch({r0, r1});
  REQUIRE(found.has_value());
  CHECK_THAT(*found, Catch::Contains("every rank issued all_reduce [4] Float, but it did not complete on rank(s) 0"));
  // Of two groups that disagree, the one that started earlier is first.
  RankTrace r2 = r0;
  r2.entries.push_back(entry(1, "send", TraceState::kStarted, 1));
  r2.entries.back().group = "pp";
  found = titan::dist::find_first_mismatch({r2, r1});
  REQUIRE(found.has_value());
  CHECK_THAT(*found, Catch::Contains("group 'pp'"));
}

TEST_CASE("The watchdog dumps a late collective and stops the rank's collectives", "[dist][flight_recorder]") {
  TempDir dir;
  // The watchdog (1 s) fires well before Gloo's own timeout (5 s, times the tests' patience). RANK is unset: the
  // process is rank 0.
  titan::dist::enable_flight_recorder(
      {.buffer_size = 8, .timeout = std::chrono::seconds(1), .folder = dir.path, .file_prefix = "rank_"});
  const fs::path dump = dir.path / "rank_0.json";
  std::string stuck, stopped;
  titan::dist::run_local_ranks(2, [&](int64_t rank, const titan::dist::Store& store) {
    const auto g = titan::dist::ProcessGroup::create("g", store, rank, 2, {0, 1},
                                                     {.init_timeout = titan::test::patience(std::chrono::seconds(60)),
                                                      .timeout = titan::test::patience(std::chrono::seconds(5)),
                                                      .backend = "strict"});
    at::Tensor x = at::ones({4});
    try {
      if (rank == 1) {  // late: issues nothing until the dump exists, and then may not
        const auto deadline = std::chrono::steady_clock::now() + titan::test::patience(std::chrono::seconds(60));
        while (!fs::exists(dump) && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        g.all_reduce(x).wait();
      } else {
        g.all_reduce(x).wait();
      }
    } catch (const std::exception& e) {
      (rank == 0 ? stuck : stopped) = titan::error_message(e);
    }
  });
  titan::dist::enable_flight_recorder({});  // off again for the other tests
  CHECK_THAT(stuck, Catch::Contains("Rank 0 is stuck in all_reduce [4] Float (seq 1 on group 'g', ranks 0,1)"));
  CHECK_THAT(stuck, Catch::Contains("rank 0 timed out after 1 s (comm.train_timeout_seconds) in all_reduce"));
  CHECK_THAT(stopped,
             Catch::Contains("expected no collective after the flight recorder stopped the run, got all_reduce"));
  REQUIRE(fs::exists(dump));
  const RankTrace trace = titan::dist::read_trace(dump);
  CHECK_THAT(trace.reason, Catch::Contains("timed out after 1 s"));
  REQUIRE(trace.entries.size() == 1);
  CHECK(trace.entries[0].op == "all_reduce");
  CHECK(trace.entries[0].state == TraceState::kStarted);
}

TEST_CASE("Hang: a rank that skips a collective stops every rank with dumps titan-trace reads",
          "[dist][launch][train][flight_recorder][full]") {
  constexpr int kTimeout = 10;  // comm.train_timeout_seconds
  TempDir dump;
  Subprocess run(
      titan::test::fsdp2_debug_job(dump.path.string(), 3, {"--comm.train_timeout_seconds", std::to_string(kTimeout)}),
      {{"TITAN_TEST_FAULTS", "skip_collective=1:12"}});
  REQUIRE(run.read_until(
      [](const std::string& out) { return out.find("test fault skip_collective: rank 1") != std::string::npos; }, 600));
  const auto skipped = std::chrono::steady_clock::now();
  const auto status = run.wait(kTimeout + 60);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - skipped).count();
  INFO(run.output());
  REQUIRE(status);
  CHECK(titan::test::exit_code(*status) != 0);
  CHECK(seconds <= kTimeout + titan::test::patience(10));
  // Both ranks say why they stopped and name the collective.
  CHECK_THAT(run.output(), Catch::Contains("rank 1 stopped at its collective #12"));
  CHECK_THAT(run.output(), Catch::Contains("Rank 0 is stuck in"));
  const fs::path traces = dump.path / "comm_traces";
  CHECK(fs::exists(traces / "rank_0.json"));
  CHECK(fs::exists(traces / "rank_1.json"));
  Subprocess trace({(titan::test::binary_dir() / "bin" / "titan-trace").string(), traces.string()});
  const auto trace_status = trace.wait(120);
  INFO(trace.output());
  REQUIRE(trace_status);
  CHECK(titan::test::exit_code(*trace_status) == 0);
  CHECK_THAT(
      trace.output(),
      Catch::Matches(
          R"([\s\S]*first mismatch: group '[^']+' \(ranks 0,1\) parts at seq \d+: rank 0 is at seq \d+: \w+ [\s\S]*rank 1 is at seq \d+: [\s\S]*and never issued seq \d+[\s\S]*)"));
  WARN("every rank exited " << seconds << " s after rank 1 skipped its collective (timeout " << kTimeout << " s)\n"
                            << trace.output());
}
