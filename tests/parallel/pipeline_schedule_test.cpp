// SPDX-License-Identifier: BSD-3-Clause
// Pipeline schedules as data (parallel/pipeline_schedule.hpp): every built-in schedule validates, the
// textbook bubbles of GPipe, 1F1B and interleaved 1F1B, zero-bubble schedules beating 1F1B, bad
// programs rejected naming rank, step and action, the CSV format, and torchtitan's stage split.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <ostream>

#include "test_util.hpp"
#include "titan/core/error.hpp"
#include "titan/parallel/pipeline_schedule.hpp"

using namespace titan;
using test::error_of;
using namespace titan::parallel;
using Catch::Contains;
using Op = PipelineAction::Op;

// Catch prints compared programs through c10's vector printer, which needs the element's <<.
namespace titan::parallel {
std::ostream& operator<<(std::ostream& out, const PipelineAction& a) { return out << format_as(a); }
}  // namespace titan::parallel

namespace {

int64_t stages_for(PipelineSchedule schedule, int64_t pp) { return pp * (is_single_stage(schedule) ? 1 : 2); }

double simulated_bubble(PipelineSchedule schedule, int64_t pp, int64_t stages, int64_t microbatches) {
  return bubble_fraction(simulate_pipeline(make_pipeline_program(schedule, pp, stages, microbatches)));
}

/// Writes a CSV (one string per row) into `dir` and reads it as a pp-rank program.
PipelineProgram csv_program(const test::TempDir& dir, const std::vector<std::string>& rows, int64_t microbatches) {
  const auto path = dir.path / "schedule.csv";
  std::ofstream out(path);
  for (const auto& row : rows) out << row << '\n';
  out.close();
  return read_pipeline_csv(path, static_cast<int64_t>(rows.size()), microbatches);
}

std::string validation_error(const test::TempDir& dir, const std::vector<std::string>& rows, int64_t microbatches) {
  return error_of([&] { validate_pipeline_program(csv_program(dir, rows, microbatches)); });
}

const std::vector<PipelineSchedule> kAll = {
    PipelineSchedule::gpipe,      PipelineSchedule::schedule_1f1b,           PipelineSchedule::interleaved_1f1b,
    PipelineSchedule::looped_bfs, PipelineSchedule::interleaved_zero_bubble, PipelineSchedule::zbv_zero_bubble,
    PipelineSchedule::dual_pipe_v};

}  // namespace

TEST_CASE("pipeline actions print and parse in torchtitan's notation", "[parallel][pipeline]") {
  for (const char* text : {"0F0", "12B3", "1I7", "1W7", "1SEND_F0", "2RECV_F0", "2SEND_B4", "1RECV_B4"}) {
    CHECK(format_as(parse_pipeline_action(text)) == text);
  }
  CHECK(parse_pipeline_action("3RECV_B2") == PipelineAction{.op = Op::kRecvBackward, .stage = 3, .microbatch = 2});
  CHECK(parse_pipeline_action("1I3").is_compute());
  CHECK_FALSE(parse_pipeline_action("1SEND_F3").is_compute());
  for (const char* bad : {"", "F0", "0X1", "0F", "0F1x", "0UNSHARD", "-1F0"}) {
    CHECK_THROWS_WITH(parse_pipeline_action(bad), Contains(fmt::format("got '{}'", bad)));
  }
}

TEST_CASE("stages are placed looped or in a V", "[parallel][pipeline]") {
  CHECK(stage_ranks(StagePlacement::kLooped, 2, 6) == std::vector<int64_t>{0, 1, 0, 1, 0, 1});
  CHECK(stage_ranks(StagePlacement::kVShape, 4, 8) == std::vector<int64_t>{0, 1, 2, 3, 3, 2, 1, 0});
  CHECK(placement_of(PipelineSchedule::zbv_zero_bubble) == StagePlacement::kVShape);
  CHECK(placement_of(PipelineSchedule::dual_pipe_v) == StagePlacement::kVShape);
  CHECK(placement_of(PipelineSchedule::interleaved_1f1b) == StagePlacement::kLooped);
  CHECK(is_single_stage(PipelineSchedule::gpipe));
  CHECK_FALSE(is_single_stage(PipelineSchedule::looped_bfs));
  CHECK_THROWS_WITH(stage_ranks(StagePlacement::kLooped, 4, 6), Contains("multiple of pp (4), got 6"));
  CHECK_THROWS_WITH(stage_ranks(StagePlacement::kVShape, 2, 6), Contains("2 stages per rank"));
}

TEST_CASE("every schedule validates for pp 2 and 4 and several microbatch counts", "[parallel][pipeline]") {
  for (const PipelineSchedule schedule : kAll) {
    for (const int64_t pp : {2, 4}) {
      for (const int64_t m : {4, 8, 12, 16}) {
        if (schedule == PipelineSchedule::dual_pipe_v && m < 2 * pp) continue;  // needs m >= stages
        INFO(fmt::format("{} pp {} microbatches {}", choice_name(schedule), pp, m));
        const PipelineProgram program = make_pipeline_program(schedule, pp, stages_for(schedule, pp), m);
        CHECK_NOTHROW(validate_pipeline_program(program));
        CHECK(program.name == choice_name(schedule));
        CHECK(program.num_ranks == pp);
        // Full backwards for the 1F1B family, I + W for the zero-bubble ones (DualPipeV mixes both).
        int64_t full = 0, split = 0;
        for (const auto& rank : program.actions) {
          for (const PipelineAction& a : rank) {
            full += a.op == Op::kBackward;
            split += a.op == Op::kBackwardInput;
          }
        }
        const bool zero_bubble =
            schedule == PipelineSchedule::interleaved_zero_bubble || schedule == PipelineSchedule::zbv_zero_bubble;
        if (zero_bubble) CHECK(full == 0);
        if (!zero_bubble && schedule != PipelineSchedule::dual_pipe_v) CHECK(split == 0);
        CHECK(full + split == program.num_stages * m);
      }
    }
  }
  // More stages per rank, odd microbatch counts and pp 3 too.
  for (const auto& [schedule, pp, stages, m] : std::vector<std::tuple<PipelineSchedule, int64_t, int64_t, int64_t>>{
           {PipelineSchedule::interleaved_1f1b, 2, 6, 6},
           {PipelineSchedule::interleaved_1f1b, 4, 16, 8},
           {PipelineSchedule::interleaved_zero_bubble, 3, 9, 9},
           {PipelineSchedule::looped_bfs, 3, 12, 5},
           {PipelineSchedule::zbv_zero_bubble, 3, 6, 2},
           {PipelineSchedule::dual_pipe_v, 3, 6, 7},
           {PipelineSchedule::gpipe, 3, 3, 1},
           {PipelineSchedule::interleaved_1f1b, 4, 8, 3}}) {
    INFO(fmt::format("{} pp {} stages {} microbatches {}", choice_name(schedule), pp, stages, m));
    CHECK_NOTHROW(validate_pipeline_program(make_pipeline_program(schedule, pp, stages, m)));
  }
}

TEST_CASE("generated programs receive in the order their peers send", "[parallel][pipeline]") {
  // V placement: rank 0 sends stage 0's activations and stage 7's gradients to rank 1 on one channel.
  const PipelineProgram program = make_pipeline_program(PipelineSchedule::zbv_zero_bubble, 4, 8, 8);
  const PipelineAction first_recv = program.actions[1][0];
  CHECK(first_recv == PipelineAction{.op = Op::kRecvForward, .stage = 1, .microbatch = 0});
  // Adjacent stages on one rank (3 and 4 on rank 3) hand over locally: no communication between them.
  for (const PipelineAction& a : program.actions[3]) {
    CHECK_FALSE((a.op == Op::kSendForward && a.stage == 3));
    CHECK_FALSE((a.op == Op::kRecvForward && a.stage == 4));
  }
}

TEST_CASE("DualPipeV marks its overlapped F/B pairs and the validator checks them", "[parallel][pipeline]") {
  for (int64_t pp : {2, 4}) {
    const PipelineProgram program = make_pipeline_program(PipelineSchedule::dual_pipe_v, pp, 2 * pp, 4 * pp);
    REQUIRE(static_cast<int64_t>(program.overlapped.size()) == pp);
    for (int64_t rank = 0; rank < pp; ++rank) {
      // The main phase's 2 x (m - 2pp + rank + 1) pairs and the cool-down's pp - rank - 1.
      CHECK(static_cast<int64_t>(program.overlapped[static_cast<size_t>(rank)].size()) ==
            2 * (4 * pp - 2 * pp + rank + 1) + pp - rank - 1);
    }
  }
  CHECK(make_pipeline_program(PipelineSchedule::zbv_zero_bubble, 2, 4, 8).overlapped.empty());
  PipelineProgram program = make_pipeline_program(PipelineSchedule::dual_pipe_v, 2, 4, 8);
  OverlappedPair& pair = program.overlapped[1][0];
  const OverlappedPair kept = pair;
  pair.backward.microbatch += 1;  // not the forward's next compute action
  CHECK_THROWS_WITH(validate_pipeline_program(program),
                    Catch::Contains("expected an overlapped pair to be a forward followed, as the next compute action "
                                    "of the rank, by an independent full backward"));
  pair = kept;
  std::swap(pair.forward, pair.backward);
  CHECK_THROWS_WITH(validate_pipeline_program(program),
                    Catch::Contains(fmt::format("got ({};{})", pair.forward, pair.backward)));
}

TEST_CASE("GPipe, 1F1B and interleaved 1F1B have the textbook bubble", "[parallel][pipeline]") {
  // Default costs F = 1, B = 2: (p-1)/(m+p-1) and (p-1)/(v*m+p-1).
  for (const int64_t p : {2, 4}) {
    for (const int64_t m : {4, 6, 8, 16}) {
      INFO(fmt::format("pp {} microbatches {}", p, m));
      const double single = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
      CHECK(simulated_bubble(PipelineSchedule::gpipe, p, p, m) == Approx(single));
      CHECK(simulated_bubble(PipelineSchedule::schedule_1f1b, p, p, m) == Approx(single));
      CHECK(theoretical_bubble(PipelineSchedule::schedule_1f1b, p, m, 1) == Approx(single));
      for (const int64_t v : {2, 3}) {
        const double interleaved = static_cast<double>(p - 1) / static_cast<double>(v * m + p - 1);
        CHECK(simulated_bubble(PipelineSchedule::interleaved_1f1b, p, v * p, m) == Approx(interleaved));
        CHECK(theoretical_bubble(PipelineSchedule::interleaved_1f1b, p, m, v) == Approx(interleaved));
      }
    }
  }
  CHECK(simulated_bubble(PipelineSchedule::schedule_1f1b, 4, 4, 8) == Approx(3.0 / 11.0));
}

TEST_CASE("zero-bubble schedules idle less than 1F1B", "[parallel][pipeline]") {
  for (const int64_t p : {2, 4}) {
    for (const int64_t m : {2 * p, 4 * p}) {
      INFO(fmt::format("pp {} microbatches {}", p, m));
      const double one_f_one_b = simulated_bubble(PipelineSchedule::schedule_1f1b, p, p, m);
      const double interleaved = simulated_bubble(PipelineSchedule::interleaved_1f1b, p, 2 * p, m);
      const double zb = simulated_bubble(PipelineSchedule::interleaved_zero_bubble, p, 2 * p, m);
      const double zbv = simulated_bubble(PipelineSchedule::zbv_zero_bubble, p, 2 * p, m);
      const double dual = simulated_bubble(PipelineSchedule::dual_pipe_v, p, 2 * p, m);
      CHECK(zb < one_f_one_b);
      CHECK(zb < interleaved);
      CHECK(zbv < one_f_one_b);
      CHECK(dual < one_f_one_b);
      // With F = I = W only the start remains: rank p-1 waits (p-1) forwards for its first input.
      const double start_only = static_cast<double>(p - 1) / static_cast<double>(p - 1 + 2 * m * 3);
      CHECK(zbv == Approx(start_only));
      CHECK(theoretical_bubble(PipelineSchedule::zbv_zero_bubble, p, m, 2) == Approx(start_only));
    }
  }
}

TEST_CASE("the simulation follows the costs and the transfer latency", "[parallel][pipeline]") {
  const PipelineProgram program = make_pipeline_program(PipelineSchedule::gpipe, 2, 2, 1);
  const PipelineTimeline timeline = simulate_pipeline(program, {.forward = 1, .backward = 3, .transfer = 0.5});
  REQUIRE(timeline.size() == 2);
  // rank 0: F0 [0,1]; rank 1: F0 [1.5,2.5], B0 [2.5,5.5]; rank 0: B0 [6,9].
  CHECK(timeline[1][0].start == Approx(1.5));
  CHECK(timeline[1][1].end == Approx(5.5));
  CHECK(timeline[0][1].start == Approx(6));
  CHECK(timeline[0][1].end == Approx(9));
  CHECK(bubble_fraction(timeline) == Approx(1.0 - 8.0 / 18.0));
  // Overlapped actions (DualPipeV's F/B pairs run at once) count once: rank 0 busy [0, 4] of [0, 4],
  // rank 1 busy [1, 3] of it.
  using Op = PipelineAction::Op;
  const PipelineTimeline overlapped = {
      {{.action = {.op = Op::kForward, .stage = 0, .microbatch = 1}, .start = 0, .end = 3},
       {.action = {.op = Op::kBackward, .stage = 0, .microbatch = 0}, .start = 1, .end = 4}},
      {{.action = {.op = Op::kForward, .stage = 1, .microbatch = 1}, .start = 1, .end = 2},
       {.action = {.op = Op::kBackward, .stage = 1, .microbatch = 0}, .start = 1.5, .end = 3}}};
  CHECK(bubble_fraction(overlapped) == Approx(1.0 - 6.0 / 8.0));
  const std::string text = render_timeline_text(simulate_pipeline(program));
  CHECK_THAT(text, Contains("rank 0 | F0"));
  CHECK_THAT(text, Contains("B0 -"));
  CHECK_THAT(render_timeline_svg(timeline, "GPipe <2>"), Contains("GPipe &lt;2&gt;"));
  CHECK_THAT(timeline_json(timeline), Contains("{\"action\": \"1F0\", \"start\": 1.5, \"end\": 2.5}"));
}

TEST_CASE("a CSV program round-trips and gets its communication inserted", "[parallel][pipeline]") {
  test::TempDir dir;
  const PipelineProgram generated = make_pipeline_program(PipelineSchedule::interleaved_zero_bubble, 2, 4, 4);
  // Write the compute actions only (torchtitan's compute-only format), read them back.
  std::vector<std::string> rows;
  for (const auto& rank : generated.actions) {
    std::vector<std::string> cells;
    for (const PipelineAction& a : rank) {
      if (a.is_compute()) cells.push_back(format_as(a));
    }
    rows.push_back(fmt::format("{}", fmt::join(cells, ",")));
  }
  const PipelineProgram compute_only = csv_program(dir, rows, 4);
  CHECK(compute_only.actions == generated.actions);
  CHECK(compute_only.stage_rank == generated.stage_rank);
  CHECK(compute_only.num_stages == 4);
  CHECK(compute_only.name == "csv:schedule.csv");
  // With communication written out (and blank cells), nothing is added.
  rows.clear();
  for (const auto& rank : generated.actions) {
    std::vector<std::string> cells;
    for (const PipelineAction& a : rank) cells.push_back(format_as(a));
    rows.push_back(fmt::format("{},,", fmt::join(cells, ", ")));
  }
  CHECK(csv_program(dir, rows, 4).actions == generated.actions);
  // torchtitan's own example (tests/assets/custom_schedule.csv): 4 looped stages on 2 ranks.
  const PipelineProgram custom = csv_program(
      dir,
      {"0F0,0F1,0F2,0F3,0F4,0F5,0F6,0F7,2F0,2F1,2F2,2F3,2F4,2F5,2F6,2F7,2I0,2W0,2I1,2W1,0I0,0W0,0I1,0W1,2I2,2W2,2I3,"
       "2W3,0I2,0W2,0I3,0W3,2I4,2W4,2I5,2W5,0I4,0W4,0I5,0W5,2I6,2W6,2I7,2W7,0I6,0W6,0I7,0W7",
       "1F0,1F1,1F2,1F3,1F4,1F5,1F6,1F7,3F0,3F1,3F2,3F3,3F4,3F5,3F6,3F7,3I0,3W0,3I1,3W1,1I0,1W0,1I1,1W1,3I2,3W2,3I3,"
       "3W3,1I2,1W2,1I3,1W3,3I4,3W4,3I5,3W5,1I4,1W4,1I5,1W5,3I6,3W6,3I7,3W7,1I6,1W6,1I7,1W7"},
      8);
  CHECK(custom.stage_rank == std::vector<int64_t>{0, 1, 0, 1});
  CHECK_NOTHROW(validate_pipeline_program(custom));
}

TEST_CASE("bad CSV programs are rejected naming rank, step and action", "[parallel][pipeline]") {
  test::TempDir dir;
  SECTION("deadlock: each rank waits for the other") {
    // Rank 1 wants microbatch 1 first; rank 0 sends it only after microbatch 0's backward.
    const std::string e = validation_error(dir, {"0F0,0B0,0F1,0B1", "1F1,1B1,1F0,1B0"}, 2);
    CHECK_THAT(e, Contains("deadlock"));
    // Rank 1 sends microbatch 1's gradient first, so rank 0 receives it first (messages keep their order).
    CHECK_THAT(e, Contains("rank 0 step 2 (0RECV_B1) waits for 1SEND_B1 from rank 1"));
    CHECK_THAT(e, Contains("rank 1 step 1 (1RECV_F1) waits for 0SEND_F1 from rank 0"));
  }
  SECTION("missing backward") {
    const std::string e = validation_error(dir, {"0F0,0F1,0B0", "1F0,1F1,1B0,1B1"}, 2);
    CHECK_THAT(e, Contains("rank 0: expected a backward of microbatch 1 on stage 0 (0B1, or 0I1 and 0W1), got none"));
  }
  SECTION("weight half without its input half") {
    const std::string e = validation_error(dir, {"0F0,0B0", "1F0,1W0"}, 1);
    CHECK_THAT(
        e, Contains("rank 1: expected both halves of the backward of microbatch 0 on stage 1, got 1W0 without 1I0"));
  }
  SECTION("use before arrival: a receive after the compute that needs it") {
    const std::string e = validation_error(dir, {"0F0,0SEND_F0,0RECV_B0,0B0", "1F0,1RECV_F0,1B0,1SEND_B0"}, 1);
    CHECK_THAT(e, Contains("rank 1 step 0 (1F0): expected its input to have arrived earlier on rank 1 (1RECV_F0), "
                           "got 1RECV_F0 only at step 1, after it. Move 1F0 after 1RECV_F0."));
  }
  SECTION("a weight half before its input half") {
    const std::string e = validation_error(dir, {"0F0,0B0", "1F0,1W0,1I0"}, 1);
    CHECK_THAT(e, Contains("rank 1 step 2 (1W0): expected its input-gradient half earlier on rank 1 (1I0), got 1I0 "
                           "only at step 3, after it. Move 1W0 after 1I0."));
  }
  SECTION("use before the local input exists") {
    // Stages 1 and 2 share rank 1 in a V; 2F0 runs before 1F0.
    const std::string e = validation_error(dir, {"0F0,3F0,3B0,0B0", "2F0,1F0,1B0,2B0"}, 1);
    CHECK_THAT(e, Contains("rank 1 step"));
    CHECK_THAT(e, Contains("(2F0): expected its input earlier on rank 1 (1F0), got 1F0 only at step 3, after it. Move "
                           "2F0 after 1F0."));
  }
  SECTION("a send without its receive") {
    const std::string e = validation_error(dir, {"0F0,0SEND_F0,0RECV_B0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0,1SEND_F0"}, 1);
    CHECK_THAT(e, Contains("(1SEND_F0): expected a peer stage, got none (stage 1 is the last stage)"));
    const std::string e2 = validation_error(dir, {"0F0,0SEND_F0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0"}, 1);
    CHECK_THAT(e2, Contains("rank 1 step 3 (1SEND_B0): expected rank 0 to receive it (0RECV_B0), got no such receive"));
  }
  SECTION("a duplicate action") {
    // Steps count the inserted communication: 0F0, 0SEND_F0, 0F0.
    const std::string e = validation_error(dir, {"0F0,0F0,0B0", "1F0,1B0"}, 1);
    CHECK_THAT(e, Contains("rank 0 step 2 (0F0): expected each action once, got it again (first at step 0)"));
  }
  SECTION("receives out of the order they were sent") {
    const std::string e = validation_error(
        dir,
        {"0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1", "1RECV_F1,1RECV_F0,1F0,1F1,1B0,1SEND_B0,1B1,1SEND_B1"},
        2);
    CHECK_THAT(e, Contains("rank 1 step 0 (1RECV_F1): expected the receives from rank 0 in the order it sends them"));
  }
  SECTION("an action on the wrong rank, a bad cell, the wrong row count") {
    CHECK_THAT(validation_error(dir, {"0F0,1F0", "1F1"}, 2), Contains("stage 1 to run its forwards on one rank"));
    CHECK_THAT(
        validation_error(dir, {"0F0,1F0,0B0", "1B0"}, 1),
        Contains("rank 1 step 0 (1B0): expected only actions of rank 1's stages, got stage 1, which runs on rank 0"));
    CHECK_THAT(
        validation_error(dir, {"0F0,1B0,0B0", "1F0"}, 1),
        Contains("rank 0 step 1 (1B0): expected only actions of rank 0's stages, got stage 1, which runs on rank 1"));
    CHECK_THAT(validation_error(dir, {"0F0,0Q0", "1F0"}, 1), Contains("row 1 (rank 0) cell 2"));
    CHECK_THAT(validation_error(dir, {"0F0,0B0", "1F0,1B0"}, 3), Contains("microbatch 1 on stage 0"));
    CHECK_THAT(error_of([&] { csv_program(dir, {"0F0,0B0"}, 1), read_pipeline_csv(dir.path / "schedule.csv", 2, 1); }),
               Contains("expected 2 rows (one per pp rank), got 1"));
  }
}

TEST_CASE("schedules reject the wrong number of stages or microbatches", "[parallel][pipeline]") {
  CHECK_THROWS_WITH(make_pipeline_program(PipelineSchedule::schedule_1f1b, 4, 8, 8),
                    Contains("1F1B runs one stage per rank: expected 4 stages for pp 4, got 8"));
  CHECK_THROWS_WITH(make_pipeline_program(PipelineSchedule::interleaved_1f1b, 4, 4, 8),
                    Contains("expected a multiple of pp (4) of at least 8 stages, got 4"));
  CHECK_THROWS_WITH(make_pipeline_program(PipelineSchedule::interleaved_1f1b, 4, 10, 8), Contains("got 10"));
  CHECK_THROWS_WITH(make_pipeline_program(PipelineSchedule::zbv_zero_bubble, 2, 6, 8),
                    Contains("ZBVZeroBubble places stages in a V, two per rank: expected 4 stages for pp 2, got 6"));
  CHECK_THROWS_WITH(make_pipeline_program(PipelineSchedule::schedule_1f1b, 4, 4, 2), Contains("expected >= 4, got 2"));
  CHECK_THROWS_WITH(make_pipeline_program(PipelineSchedule::dual_pipe_v, 2, 4, 3), Contains("expected >= 4, got 3"));
  CHECK_THROWS_WITH(make_pipeline_program(PipelineSchedule::interleaved_1f1b, 4, 8, 9),
                    Contains("expected a multiple of 2 microbatches"));
}

TEST_CASE("the stage count follows torchtitan", "[parallel][pipeline]") {
  // Unset layers_per_stage: 1 stage per rank for single-stage schedules, 2 for the others.
  CHECK(num_pipeline_stages(PipelineSchedule::schedule_1f1b, 4, 32, 0, 1, 1) == 4);
  CHECK(num_pipeline_stages(PipelineSchedule::interleaved_1f1b, 4, 32, 0, 1, 1) == 8);
  CHECK(num_pipeline_stages(PipelineSchedule::zbv_zero_bubble, 4, 32, 0, 1, 1) == 8);
  // ceil((layers + first_less + last_less) / layers_per_stage): (30 + 1 + 1) / 4 = 8.
  CHECK(num_pipeline_stages(PipelineSchedule::interleaved_1f1b, 2, 30, 4, 1, 1) == 8);
  CHECK(num_pipeline_stages(PipelineSchedule::gpipe, 2, 6, 4, 1, 1) == 2);
  // (6 + 2) / 3 = 3 stages on 2 ranks.
  CHECK_THROWS_WITH(num_pipeline_stages(PipelineSchedule::interleaved_1f1b, 2, 6, 3, 1, 1),
                    Contains("multiple of parallelism.pipeline_parallel_degree (2), got 3"));
  CHECK_THROWS_WITH(num_pipeline_stages(PipelineSchedule::schedule_1f1b, 2, 6, 2, 1, 1),
                    Contains("1F1B runs one stage per rank: expected 2 stages, got 4"));
  CHECK_THROWS_WITH(num_pipeline_stages(PipelineSchedule::interleaved_1f1b, 2, 6, 4, 1, 1),
                    Contains("expected at least 4 stages, got 2"));
  CHECK_THROWS_WITH(num_pipeline_stages(PipelineSchedule::zbv_zero_bubble, 2, 14, 2, 1, 1),
                    Contains("two per rank: expected 4 stages, got 8"));
}

TEST_CASE("the stage split matches torchtitan's generate_llm_fqn_per_model_part", "[parallel][pipeline]") {
  const auto llm = [](int64_t layers, int64_t first_less = 1, int64_t last_less = 1) {
    PipelineSplit split{.input_modules = {"tok_embeddings"},
                        .output_modules = {"norm", "output"},
                        .first_stage_less_layers = first_less,
                        .last_stage_less_layers = last_less};
    for (int64_t i = 0; i < layers; ++i) split.layer_modules.push_back(fmt::format("layers.{}", i));
    return split;
  };
  using Parts = std::vector<std::vector<std::string>>;
  // 6 layers, 2 stages: effective 8, 4 each; stage 0 = embeddings (1) + 3 layers, stage 1 = 3 + norm/output (1).
  CHECK(split_pipeline_stages(llm(6), 2) == Parts{{"tok_embeddings", "layers.0", "layers.1", "layers.2"},
                                                  {"layers.3", "layers.4", "layers.5", "norm", "output"}});
  // 8 layers, 4 stages: effective 10 = 3,3,2,2: stage 0 = emb + 2, stage 3 = 1 + norm/output.
  CHECK(split_pipeline_stages(llm(8), 4) == Parts{{"tok_embeddings", "layers.0", "layers.1"},
                                                  {"layers.2", "layers.3", "layers.4"},
                                                  {"layers.5", "layers.6"},
                                                  {"layers.7", "norm", "output"}});
  // torchtitan's docstring case: 3 layers, 2 stages, weights 2: effective 7 = 4,3.
  CHECK(split_pipeline_stages(llm(3, 2, 2), 2) ==
        Parts{{"tok_embeddings", "layers.0", "layers.1"}, {"layers.2", "norm", "output"}});
  // 2 layers, 4 stages: one effective layer each; stage 0 holds only the embeddings.
  CHECK(split_pipeline_stages(llm(2), 4) == Parts{{"tok_embeddings"}, {"layers.0"}, {"layers.1"}, {"norm", "output"}});
  // One stage holds everything.
  CHECK(split_pipeline_stages(llm(2), 1) == Parts{{"tok_embeddings", "layers.0", "layers.1", "norm", "output"}});
  // Too many stages leave one without a layer; heavy embeddings cannot fit one stage's share.
  CHECK_THROWS_WITH(split_pipeline_stages(llm(2), 5),
                    Contains("got stage 4 without one: 5 stages for 4 effective layers"));
  CHECK_THROWS_WITH(split_pipeline_stages(llm(4, 3, 1), 4),
                    Contains("pipeline_parallel_first_stage_less_layers (3) <= the layers per stage (2)"));
  CHECK_THROWS_WITH(split_pipeline_stages(llm(4, 1, 3), 4), Contains("stage 3 would hold fewer than no layers"));
}
