// SPDX-License-Identifier: BSD-3-Clause
// Pipeline schedules: action notation, stage placement, the program of a built-in schedule and the
// published bubble formulas. The orders themselves are in pipeline_generators.cpp, the
// send/receive insertion in pipeline_comm.cpp, the checks in pipeline_validate.cpp.
#include "titan/parallel/pipeline_schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <optional>

#include "pipeline_internal.hpp"
#include "titan/core/error.hpp"

namespace titan::parallel {
namespace {

using Op = PipelineAction::Op;

/// torchtitan's spelling of each op, in enum order.
constexpr std::array<std::string_view, 8> kOpNames = {"F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"};

std::string_view op_name(Op op) { return kOpNames[static_cast<size_t>(op)]; }

/// Reads a non-negative decimal at the front of `text`, or nothing.
std::optional<int64_t> leading_number(std::string_view& text) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end == text.data() || value < 0) return std::nullopt;
  text.remove_prefix(static_cast<size_t>(end - text.data()));
  return value;
}

std::string_view schedule_name(PipelineSchedule schedule) { return choice_name(schedule); }

}  // namespace

bool PipelineAction::is_compute() const {
  return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput || op == Op::kBackwardWeight;
}

std::string format_as(const PipelineAction& action) {
  return fmt::format("{}{}{}", action.stage, op_name(action.op), action.microbatch);
}

PipelineAction parse_pipeline_action(std::string_view text) {
  const std::string original(text);
  std::string_view rest = text;
  const std::optional<int64_t> stage = leading_number(rest);
  // Longest op name first: "SEND_F" must not be read as an unknown op after "S".
  std::optional<Op> op;
  for (size_t i = 0; i < kOpNames.size() && stage; ++i) {
    if (rest.starts_with(kOpNames[i]) && (!op || kOpNames[i].size() > op_name(*op).size())) op = static_cast<Op>(i);
  }
  std::optional<int64_t> microbatch;
  if (op) {
    rest.remove_prefix(op_name(*op).size());
    microbatch = leading_number(rest);
  }
  TITAN_CHECK_VALUE(stage && op && microbatch && rest.empty(),
                    "[titan::pipeline] expected an action <stage><op><microbatch> such as 2F0, 1I3 or 1SEND_F0 "
                    "(op one of F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B), got '{}'. Fix the cell.",
                    original);
  return {.op = *op, .stage = *stage, .microbatch = *microbatch};
}

bool is_single_stage(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::gpipe || schedule == PipelineSchedule::schedule_1f1b;
}

StagePlacement placement_of(PipelineSchedule schedule) {
  const bool v = schedule == PipelineSchedule::zbv_zero_bubble || schedule == PipelineSchedule::dual_pipe_v;
  return v ? StagePlacement::kVShape : StagePlacement::kLooped;
}

std::vector<int64_t> stage_ranks(StagePlacement placement, int64_t pp, int64_t stages) {
  TITAN_CHECK_VALUE(pp >= 1 && stages >= pp && stages % pp == 0,
                    "[titan::pipeline] expected the number of stages to be a positive multiple of pp ({}), got {}. "
                    "Change parallelism.pipeline_parallel_layers_per_stage or the schedule.",
                    pp, stages);
  TITAN_CHECK_VALUE(placement == StagePlacement::kLooped || stages == 2 * pp,
                    "[titan::pipeline] expected a V placement to have 2 stages per rank ({} for pp {}), got {}.",
                    2 * pp, pp, stages);
  std::vector<int64_t> ranks(static_cast<size_t>(stages));
  for (int64_t s = 0; s < stages; ++s) {
    // V: down the ranks for the first half, back up for the second, so rank 0 holds the first and last.
    ranks[static_cast<size_t>(s)] = placement == StagePlacement::kLooped ? s % pp : (s < pp ? s : 2 * pp - 1 - s);
  }
  return ranks;
}

PipelineProgram make_pipeline_program(PipelineSchedule schedule, int64_t pp, int64_t stages, int64_t microbatches) {
  const std::string_view name = schedule_name(schedule);
  TITAN_CHECK_VALUE(pp >= 1 && microbatches >= 1,
                    "[titan::pipeline] {}: expected pp >= 1 and microbatches >= 1, got pp {} and {} microbatches.",
                    name, pp, microbatches);
  if (is_single_stage(schedule)) {
    TITAN_CHECK_VALUE(stages == pp,
                      "[titan::pipeline] {} runs one stage per rank: expected {} stages for pp {}, got {}. Use a "
                      "multi-stage schedule (Interleaved1F1B, ZBVZeroBubble, ...) or unset "
                      "parallelism.pipeline_parallel_layers_per_stage.",
                      name, pp, pp, stages);
  } else if (placement_of(schedule) == StagePlacement::kVShape) {
    TITAN_CHECK_VALUE(stages == 2 * pp,
                      "[titan::pipeline] {} places stages in a V, two per rank: expected {} stages for pp {}, got "
                      "{}. Set parallelism.pipeline_parallel_layers_per_stage so that there are {} stages.",
                      name, 2 * pp, pp, stages, 2 * pp);
  } else {
    TITAN_CHECK_VALUE(stages >= 2 * pp && stages % pp == 0,
                      "[titan::pipeline] {} runs several stages per rank: expected a multiple of pp ({}) of at least "
                      "{} stages, got {}. Change parallelism.pipeline_parallel_layers_per_stage.",
                      name, pp, 2 * pp, stages);
  }
  // The interleaved orders go round by round of microbatches_per_round microbatches (Megatron's
  // requirement that m be a multiple of pp, relaxed as in PyTorch to a multiple of the round count).
  const int64_t rounds = std::max<int64_t>(1, microbatches / pp);
  const bool interleaved =
      schedule == PipelineSchedule::interleaved_1f1b || schedule == PipelineSchedule::interleaved_zero_bubble;
  TITAN_CHECK_VALUE(!interleaved || microbatches % rounds == 0,
                    "[titan::pipeline] {} runs microbatches in rounds of about pp: expected a multiple of {} "
                    "microbatches (m // pp rounds), got {}. Use a multiple of pp ({}).",
                    name, rounds, microbatches, pp);
  TITAN_CHECK_VALUE(schedule != PipelineSchedule::schedule_1f1b || microbatches >= pp,
                    "[titan::pipeline] 1F1B needs at least as many microbatches as stages: expected >= {}, got {}. "
                    "Lower parallelism.pipeline_parallel_microbatch_size.",
                    pp, microbatches);
  TITAN_CHECK_VALUE(schedule != PipelineSchedule::dual_pipe_v || microbatches >= stages,
                    "[titan::pipeline] DualPipeV needs at least as many microbatches as stages: expected >= {}, got "
                    "{}. Lower parallelism.pipeline_parallel_microbatch_size.",
                    stages, microbatches);

  detail::RankOrders orders;
  std::vector<std::vector<OverlappedPair>> overlapped;
  switch (schedule) {
    case PipelineSchedule::gpipe:
      orders = detail::gpipe_order(pp, microbatches);
      break;
    case PipelineSchedule::schedule_1f1b:
      orders = detail::one_f_one_b_order(pp, microbatches);
      break;
    case PipelineSchedule::interleaved_1f1b:
      orders = detail::interleaved_order(pp, stages, microbatches, /*zero_bubble=*/false);
      break;
    case PipelineSchedule::interleaved_zero_bubble:
      orders = detail::interleaved_order(pp, stages, microbatches, /*zero_bubble=*/true);
      break;
    case PipelineSchedule::looped_bfs:
      orders = detail::looped_bfs_order(pp, stages, microbatches);
      break;
    case PipelineSchedule::zbv_zero_bubble:
      orders = detail::zbv_order(pp, microbatches);
      break;
    case PipelineSchedule::dual_pipe_v:
      orders = detail::dual_pipe_v_order(pp, microbatches, &overlapped);
      break;
  }
  PipelineProgram program{.name = std::string(name),
                          .num_ranks = pp,
                          .num_stages = stages,
                          .num_microbatches = microbatches,
                          .stage_rank = stage_ranks(placement_of(schedule), pp, stages),
                          .actions = std::move(orders),
                          .overlapped = std::move(overlapped)};
  add_pipeline_communication(program);
  // A generated program that fails here is a titan bug; the check costs microseconds.
  validate_pipeline_program(program);
  return program;
}

double theoretical_bubble(PipelineSchedule schedule, int64_t pp, int64_t microbatches, int64_t stages_per_rank,
                          const PipelineCosts& costs) {
  const auto p = static_cast<double>(pp);
  const auto m = static_cast<double>(microbatches);
  const auto v = static_cast<double>(stages_per_rank);
  const double f = costs.forward;
  const double b = costs.backward;
  const double i = costs.backward_input;
  const double w = costs.backward_weight;
  // Idle time over the rank's busy time plus idle time, with idle time from the papers (per stage).
  const auto fraction = [](double idle, double busy) { return idle <= 0 ? 0.0 : idle / (idle + busy); };
  switch (schedule) {
    case PipelineSchedule::gpipe:
    case PipelineSchedule::schedule_1f1b:
      return fraction((p - 1) * (f + b), m * (f + b));
    case PipelineSchedule::interleaved_1f1b:
    case PipelineSchedule::looped_bfs:
      // Megatron (Narayanan et al. 2021): the 1F1B bubble divided by v; BFS (Lamy-Poirier 2023) the same.
      return fraction((p - 1) * (f + b), v * m * (f + b));
    case PipelineSchedule::interleaved_zero_bubble:
      // ZB-H1 (Qi et al. 2024): W's fill (p-1) W-slots of the 1F1B bubble.
      return fraction((p - 1) * (f + i - w), v * m * (f + i + w));
    case PipelineSchedule::zbv_zero_bubble:
      // ZB-V (section 6): no bubble in the steady state when I <= 2W; what remains is the start every
      // schedule pays, rank p-1 waiting (p-1)F for the first microbatch, plus (p-1)(I - 2W) otherwise.
      return fraction((p - 1) * (f + std::max(0.0, i - 2 * w)), v * m * (f + i + w));
    case PipelineSchedule::dual_pipe_v:
      // DeepSeek-V3 table 2 with 2p stages: (p-1)(F&B + B - 3W); here F&B runs as F then B.
      return fraction((p - 1) * ((f + b) + b - 3 * w), v * m * (f + i + w));
  }
  return 0;
}

namespace detail {

std::string where(const PipelineProgram& program) { return fmt::format("[titan::pipeline] {}:", program.name); }

}  // namespace detail
}  // namespace titan::parallel
