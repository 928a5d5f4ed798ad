// SPDX-License-Identifier: BSD-3-Clause
// Pipeline schedules as data: every pp rank's program (forward, backward, split backward, and the
// point-to-point sends and receives between stages), generated for GPipe, 1F1B, Interleaved 1F1B,
// Looped BFS, Interleaved zero-bubble, ZBV zero-bubble and DualPipeV, or read from torchtitan's CSV
// format. A validator simulates a program before it runs and rejects one that would deadlock, use a
// tensor before it arrives or leave a microbatch unfinished, naming the rank, step and action. The
// runtime (parallel/pipeline.hpp) executes the programs exactly as written.
//
//   auto program = make_pipeline_program(PipelineSchedule::zbv_zero_bubble, /*pp=*/4, /*stages=*/8, /*mb=*/8);
//   validate_pipeline_program(program);                         // throws naming rank, step, action
//   fmt::print("{}", render_timeline_text(simulate_pipeline(program)));
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "titan/core/choices.hpp"

namespace titan::parallel {

/// One step of a rank's program. torchtitan's notation "<stage><op><microbatch>": "2F0" (stage 2's
/// forward of microbatch 0), "1B3" (full backward), "1I3" / "1W3" (input- / weight-gradient half),
/// "1SEND_F0" (stage 1 sends its output of microbatch 0 to the next stage), "2RECV_F0" (stage 2
/// receives its input), "2SEND_B0" (stage 2 sends the gradient of its input to the stage before),
/// "1RECV_B0" (stage 1 receives the gradient of its output).
struct PipelineAction {
  enum class Op {
    kForward,
    kBackward,
    kBackwardInput,
    kBackwardWeight,
    kSendForward,
    kRecvForward,
    kSendBackward,
    kRecvBackward
  };
  /// What to do.
  Op op = Op::kForward;
  /// Global stage index (0 = the stage holding the embeddings).
  int64_t stage = 0;
  /// Microbatch index within the step.
  int64_t microbatch = 0;

  bool operator==(const PipelineAction&) const = default;
  /// Forward, backward or one of its halves (not a send or receive).
  bool is_compute() const;
};

/// "2F0", "1SEND_B3", ...
std::string format_as(const PipelineAction& action);
/// Parses torchtitan's notation; a ValueError names the text otherwise.
PipelineAction parse_pipeline_action(std::string_view text);

/// How stages are laid on ranks: looped (stage s on rank s % pp) or V-shaped (rank r holds stages
/// r and 2pp-1-r, so the first and last stage share rank 0).
enum class StagePlacement { kLooped, kVShape };

/// Single-stage schedules (GPipe, 1F1B) run one stage per rank; the others run several.
bool is_single_stage(PipelineSchedule schedule);
/// ZBV and DualPipeV place stages in a V (exactly two per rank).
StagePlacement placement_of(PipelineSchedule schedule);
/// The rank of each of `stages` stages under placement (stages must be a multiple of pp).
std::vector<int64_t> stage_ranks(StagePlacement placement, int64_t pp, int64_t stages);

/// A forward and a full backward of another microbatch that a rank may run at the same time, so the
/// communication of one (its sends and receives, the all-to-alls inside its layers) hides behind the
/// other's compute: DualPipe's overlapped chunk pair (torchtitan's OVERLAP_F_B). In the rank's program
/// the backward is the next compute action after the forward, and it does not depend on the forward.
struct OverlappedPair {
  /// The forward ("2F5").
  PipelineAction forward{};
  /// The full backward ("1B3").
  PipelineAction backward{};

  bool operator==(const OverlappedPair&) const = default;
};

/// Every rank's program. The runtime executes actions[rank] in order: a send is posted and not
/// waited for, a receive is posted and waited for by the compute action that needs it.
struct PipelineProgram {
  /// Schedule name ("1F1B", "ZBVZeroBubble", "csv:<file>").
  std::string name{};
  /// pp degree.
  int64_t num_ranks = 1;
  /// Stages in the whole pipeline.
  int64_t num_stages = 1;
  /// Microbatches per step.
  int64_t num_microbatches = 1;
  /// stage -> rank.
  std::vector<int64_t> stage_rank{};
  /// Per rank, the actions in execution order (compute and communication).
  std::vector<std::vector<PipelineAction>> actions{};
  /// Per rank, the forward/backward pairs it may overlap, in program order (DualPipeV marks its
  /// overlapped pairs; other schedules and CSV programs have none). Empty: no rank has any.
  std::vector<std::vector<OverlappedPair>> overlapped{};
};

/// The program of `schedule` for pp ranks, `stages` stages in all and `microbatches` microbatches,
/// with sends and receives inserted. Errors (ValueError naming the schedule): stages not what the
/// schedule runs (single-stage: stages == pp; V: stages == 2pp; others: a multiple of pp, >= 2pp),
/// fewer microbatches than the schedule needs.
PipelineProgram make_pipeline_program(PipelineSchedule schedule, int64_t pp, int64_t stages, int64_t microbatches);

/// Reads torchtitan's CSV schedule (a row per rank, a cell per action, compute-only or with
/// communication actions; compute-only programs get their sends and receives inserted). The stage
/// placement is read from which rank runs each stage's forward. Errors name the file, row and cell.
PipelineProgram read_pipeline_csv(const std::filesystem::path& csv, int64_t pp, int64_t microbatches);

/// Inserts the sends and receives between stages on different ranks: a send right after the compute
/// that produces the tensor, a receive right before the compute that consumes it. Existing
/// communication actions are kept (nothing is inserted twice).
void add_pipeline_communication(PipelineProgram& program);

/// Simulates the program (sends never block, a receive blocks until its send was posted) and throws
/// a ValueError naming the rank, step (index in its program) and action when it would deadlock
/// (and which ranks wait on what), compute on a tensor that has not arrived, run an action twice,
/// or leave a microbatch without its forward or backward on some stage.
void validate_pipeline_program(const PipelineProgram& program);

/// Durations of the actions, in any unit, for simulation.
struct PipelineCosts {
  /// One stage's forward of one microbatch.
  double forward = 1.0;
  /// Full backward.
  double backward = 2.0;
  /// Input-gradient half.
  double backward_input = 1.0;
  /// Weight-gradient half.
  double backward_weight = 1.0;
  /// Latency of one send -> receive.
  double transfer = 0.0;
};

/// One executed action with its start and end (simulated units or measured seconds).
struct TimedAction {
  /// The action.
  PipelineAction action{};
  /// Start time.
  double start = 0;
  /// End time.
  double end = 0;
};

/// Per rank, its compute actions with times.
using PipelineTimeline = std::vector<std::vector<TimedAction>>;

/// The ideal timeline of a valid program under costs.
PipelineTimeline simulate_pipeline(const PipelineProgram& program, const PipelineCosts& costs = {});

/// Idle fraction: 1 - (time each rank computes, overlapping actions counted once) / (ranks x (last end -
/// first start)).
double bubble_fraction(const PipelineTimeline& timeline);

/// The schedule's published bubble fraction for pp ranks, m microbatches and v stages per rank
/// (GPipe and 1F1B: (p-1)/(m+p-1); interleaved: (p-1)/(v*m+p-1); zero-bubble schedules: their
/// papers' formulas with the costs' F/B/W).
double theoretical_bubble(PipelineSchedule schedule, int64_t pp, int64_t microbatches, int64_t stages_per_rank,
                          const PipelineCosts& costs = {});

/// Ranks as rows, time as columns, one cell per action ("F0", "B3", ...; '.' idle).
std::string render_timeline_text(const PipelineTimeline& timeline);
/// The same as an SVG picture (forward, backward, input- and weight-gradient in distinct colours).
std::string render_timeline_svg(const PipelineTimeline& timeline, std::string_view title);
/// {"ranks": [[{"action": "0F0", "start": s, "end": e}, ...], ...]}: the measured timeline a run
/// writes to its folder.
std::string timeline_json(const PipelineTimeline& timeline);

/// How a model with `layers` repeated blocks is cut into stages (torchtitan's split).
struct PipelineSplit {
  /// Modules before the blocks (e.g. {"tok_embeddings"}); they count as first_stage_less_layers.
  std::vector<std::string> input_modules{};
  /// The repeated blocks in order (e.g. "layers.0" ... "layers.31").
  std::vector<std::string> layer_modules{};
  /// Modules after the blocks (e.g. {"norm", "output"}); they count as last_stage_less_layers.
  std::vector<std::string> output_modules{};
  /// Layers the input modules count as (parallelism.pipeline_parallel_first_stage_less_layers).
  int64_t first_stage_less_layers = 1;
  /// Layers the output modules count as (parallelism.pipeline_parallel_last_stage_less_layers).
  int64_t last_stage_less_layers = 1;
};

/// Stages in the pipeline as torchtitan computes them: pp x 1 for single-stage schedules, pp x 2 for
/// the others, or ceil((layers + first_less + last_less) / layers_per_stage) when layers_per_stage > 0
/// (then a multiple of pp, and 1 or 2 per rank as the schedule requires). Errors name the keys.
int64_t num_pipeline_stages(PipelineSchedule schedule, int64_t pp, int64_t layers, int64_t layers_per_stage,
                            int64_t first_stage_less_layers, int64_t last_stage_less_layers);

/// Module paths per stage: effective = layers + first_less + last_less, each stage gets
/// effective / stages (the first effective % stages one more); stage 0 starts with the input
/// modules, the last ends with the output modules. Errors name the stage left without a layer.
std::vector<std::vector<std::string>> split_pipeline_stages(const PipelineSplit& split, int64_t stages);

/// What one token costs in each module group of a PipelineSplit, in any additive unit (titan's decoders
/// give training FLOPs: models::pipeline_costs).
struct PipelineModuleCosts {
  /// The input modules together (a lookup embedding: 0 FLOPs).
  double input = 0;
  /// Each of split.layer_modules, in order.
  std::vector<double> layers{};
  /// The output modules together (norm, output projection; the loss is elementwise).
  double output = 0;
};

/// Module paths per stage cut by cost (parallelism.pipeline_parallel_split = flops): the input
/// modules, each layer and the output modules are cut into `stages` contiguous, non-empty stages
/// whose largest cost is the least possible (the pipeline runs at its slowest stage's pace), and among
/// those cuts the one with the least sum of squared stage costs (the other stages as even as they can
/// be). first/last_stage_less_layers play no part. Errors: costs that do not match the split, more
/// stages than modules to fill them.
std::vector<std::vector<std::string>> balance_pipeline_stages(const PipelineSplit& split,
                                                              const PipelineModuleCosts& costs, int64_t stages);

/// The cost of each stage of `stages` (module paths over split's modules): the input and output
/// modules count once, with the stage that holds the first of them.
std::vector<double> pipeline_stage_costs(const PipelineSplit& split, const PipelineModuleCosts& costs,
                                         const std::vector<std::vector<std::string>>& stages);

}  // namespace titan::parallel
