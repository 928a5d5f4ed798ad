// SPDX-License-Identifier: BSD-3-Clause
// Pipeline bubble benchmark: real training steps (pipeline forward + backward, clipping, AdamW) of a
// Llama 3 flavor cut into stages over pp ranks as threads of one process (Gloo over loopback, one
// intra-op thread each), one sequence per microbatch. Per (pp, schedule, microbatches), one row of:
//   - the measured bubble: bubble_fraction of every rank's compute-only timeline of the last step,
//     and the mean over the timed steps (ComputeClock: the runtime's timeline counts a rank waiting
//     for its input as busy; that figure is printed beside it);
//   - the replayed bubble: the program with each (stage, kind)'s mean measured duration, no core
//     shared (keeps the stage imbalance, drops contention and communication);
//   - the simulated bubble: simulate_pipeline with the mean F, B, I, W durations of the run (also
//     drops the imbalance), and the schedule's published bubble (theoretical_bubble, same costs);
//   - the median step time, and how much slower the mean forward ran than the same stages' forwards
//     alone on one thread before the run ("F slowdown": CPU contention between rank threads);
//   - per rank, max_in_flight against the schedule's bound, and the peak activation memory: the rank's
//     program replayed in order, each forward adding and each B (or W) releasing the bytes one
//     microbatch of that stage keeps alive (measured once with c10's allocation-reporting hook, see
//     profile_stages), i.e. max_in_flight x those bytes for one-stage ranks.
// Under each configuration it notes the stages' training FLOPs (models::pipeline_costs) as the largest
// stage over the mean, for the split run (--split) and for torchtitan's default split of the same model.
// Ranks compete for cores when pp exceeds them (pp 4 on a 2-core machine): a measured bubble then
// mixes pipeline idle time with contention; see docs/performance.md.
// Every configuration of the grid is planned before any is timed: one a schedule refuses (DualPipeV
// takes at least 2 pp microbatches, 1F1B pp) is skipped with the schedule's own message, so one grid
// covers every schedule. --dry-run stops there: each configuration's stages and its bubble simulated at
// unit costs, nothing timed. Run:
//   build/bin/bench_pipeline --pp 4,2 --microbatches 4,8,16 --n-layers 15 --split flops
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <variant>
#include <vector>

#include "../tests/alloc_tracker.hpp"
#include "bench_flags.hpp"
#include "pipeline_rank.hpp"
#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/loss.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/optim/clip.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/parallel/planner.hpp"

namespace {

using titan::PipelineSchedule;
using titan::parallel::PipelineAction;
using titan::parallel::PipelineProgram;
using titan::parallel::PipelineTimeline;
using Op = PipelineAction::Op;
using Clock = std::chrono::steady_clock;

struct Options {
  /// Schedules to run, comma-separated.
  std::string schedules = "GPipe,1F1B,Interleaved1F1B,ZBVZeroBubble,InterleavedZeroBubble,DualPipeV";
  std::vector<int64_t> pp{4};  ///< pipeline degrees (ranks as threads)
  /// Microbatches per step (1 sequence each); 8 = 2 pp is the fewest DualPipeV takes at pp 4, so every
  /// schedule runs every default.
  std::vector<int64_t> microbatches{8, 16};
  std::string flavor = "debugmodel";  ///< Llama 3 flavor
  int64_t n_layers = 0;               ///< blocks of the flavor (0 = the flavor's own)
  std::string split = "layers";       ///< parallelism.pipeline_parallel_split: layers or flops
  int64_t seq_len = 256;              ///< tokens per sequence
  int64_t steps = 3;                  ///< timed steps (after 1 warm-up step)
  std::string svg_dir{};              ///< when set, each configuration's last measured timeline as SVG here
  bool dry_run = false;               ///< plan and check every configuration, time none
};

Options parse(int argc, char** argv) {
  Options o;
  titan::bench::parse_flags(argc, argv, "bench_pipeline",
                            {{"--schedules", &o.schedules},
                             {"--pp", &o.pp},
                             {"--microbatches", &o.microbatches},
                             {"--flavor", &o.flavor},
                             {"--n-layers", &o.n_layers},
                             {"--split", &o.split},
                             {"--seq-len", &o.seq_len},
                             {"--steps", &o.steps},
                             {"--svg-dir", &o.svg_dir},
                             {"--dry-run", &o.dry_run}});
  return o;
}

std::vector<PipelineSchedule> parse_schedules(const std::string& list) {
  std::vector<PipelineSchedule> out;
  std::stringstream ss(list);
  for (std::string name; std::getline(ss, name, ',');) {
    const auto schedule = titan::parse_choice<PipelineSchedule>(name);
    TITAN_CHECK_VALUE(schedule.has_value(), "[bench_pipeline] expected --schedules from {}, got '{}'.",
                      titan::choice_list<PipelineSchedule>(), name);
    out.push_back(*schedule);
  }
  return out;
}

titan::llama3::Llama3Args model_args(const Options& o) {
  titan::llama3::Llama3Args args = titan::llama3::flavor(o.flavor);
  if (o.n_layers > 0) args.n_layers = o.n_layers;
  return args;
}

titan::PipelineSplitBy split_by(const std::string& name) {
  const auto split = titan::parse_choice<titan::PipelineSplitBy>(name);
  TITAN_CHECK_VALUE(split.has_value(), "[bench_pipeline] expected --split from {}, got '{}'.",
                    titan::choice_list<titan::PipelineSplitBy>(), name);
  return *split;
}

titan::parallel::PipelinePlan make_plan(const Options& o, int64_t pp, PipelineSchedule schedule,
                                        titan::PipelineSplitBy split) {
  titan::ParallelismConfig parallelism;
  parallelism.pipeline_parallel_schedule = schedule;
  parallelism.pipeline_parallel_split = split;
  titan::llama3::Llama3Args args = model_args(o);
  args.max_seq_len = o.seq_len;  // the FLOPs split weighs attention at the run's sequence length
  const titan::parallel::ShardingSpec spec = titan::llama3::Llama3::build(args)->sharding_spec();
  return titan::parallel::pipeline_plan(spec.pipeline, spec.pipeline_costs, pp, parallelism);
}

titan::parallel::PipelinePlan make_plan(const Options& o, int64_t pp, PipelineSchedule schedule) {
  return make_plan(o, pp, schedule, split_by(o.split));
}

/// The program of one configuration, or why the schedule refuses it: the message of its input check
/// (a c10::ValueError from the split or the program: too few microbatches, stages that do not divide).
/// Anything else is a fault and propagates.
std::variant<PipelineProgram, std::string> plan_config(const Options& o, int64_t pp, PipelineSchedule schedule,
                                                       int64_t microbatches) {
  try {
    const auto stages = static_cast<int64_t>(make_plan(o, pp, schedule).stages.size());
    return titan::parallel::make_pipeline_program(schedule, pp, stages, microbatches);
  } catch (const c10::ValueError& e) {
    return titan::error_message(e);
  }
}

/// The largest stage's training FLOPs over the mean stage's: 1 is a balanced pipeline; the slowest
/// stage sets the pace, so a bubble-free pipeline of these stages would still idle 1 - 1/this.
double flops_imbalance(const Options& o, const std::vector<std::vector<std::string>>& stages) {
  using namespace titan;
  const llama3::Llama3Args args = model_args(o);
  const auto whole = std::make_shared<llama3::Llama3>(args, o.seq_len, at::TensorOptions().device(at::kMeta));
  const parallel::ShardingSpec spec = whole->sharding_spec();
  const std::vector<double> costs = parallel::pipeline_stage_costs(spec.pipeline, spec.pipeline_costs, stages);
  double total = 0;
  for (double c : costs) total += c;
  return *std::max_element(costs.begin(), costs.end()) / (total / static_cast<double>(costs.size()));
}

/// What one microbatch costs each stage, measured on the whole model on this thread alone.
struct StageProfile {
  /// Per stage: bytes one microbatch keeps alive from its forward to its backward: what the forward
  /// allocated and did not free while its output (the loss on the last stage) is held, plus the
  /// received input (stages > 0).
  std::vector<int64_t> activation_bytes;
  /// Per stage: seconds of one forward, no rank thread running (best of 3).
  std::vector<double> forward_seconds;
};

/// The allocations are counted by c10's memory-reporting hook (the profiler's; tests/alloc_tracker.hpp)
/// on this thread: the tensors autograd saved for backward plus the output, as the pipeline
/// runtime holds them per (stage, microbatch) until the backward.
StageProfile profile_stages(const Options& o, const titan::parallel::PipelinePlan& plan) {
  using namespace titan;
  const llama3::Llama3Args args = model_args(o);
  nn::manual_init_seed(0);
  llama3::Llama3 model(args, o.seq_len, at::TensorOptions());
  model.init_weights();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor tokens = at::randint(args.vocab_size, {1, o.seq_len}, gen, at::kLong);  // (1, S)
  const at::Tensor labels = at::randint(args.vocab_size, {1, o.seq_len}, gen, at::kLong);  // (1, S)
  const double scale = 1.0 / static_cast<double>(o.seq_len);
  const int64_t n = static_cast<int64_t>(plan.stages.size());
  StageProfile profile;
  for (int64_t s = 0; s < n; ++s) {
    const auto& modules = plan.stages[static_cast<size_t>(s)];
    // A stage's input: the tokens, or the previous stage's hidden state as a leaf (as received).
    const at::Tensor input =
        s == 0 ? tokens : at::randn({1, o.seq_len, args.dim}, gen).requires_grad_(true);  // (1, S) or (1, S, D)
    const auto stage_forward = [&] {
      at::Tensor y = model.forward_part(input, modules);  // (1, S, D), or logits (1, S, V) on the last
      // The runtime keeps the scaled loss of the last stage, not the logits.
      return s == n - 1 ? cross_entropy_sum(y, labels) * scale : y;
    };
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto begin = Clock::now();
      at::Tensor y = stage_forward();
      best = std::min(best, std::chrono::duration<double>(Clock::now() - begin).count());
      y.backward(s == n - 1 ? at::Tensor() : at::ones_like(y));  // leaves nothing saved behind
    }
    int64_t bytes = 0;
    {
      const test::TrackAllocations track;
      const at::Tensor y = stage_forward();
      bytes = track.stats().live;  // read while y (and so its graph) is alive
    }
    profile.activation_bytes.push_back(bytes + (s > 0 ? input.nbytes() : 0));
    profile.forward_seconds.push_back(best);
  }
  model.zero_grad();
  return profile;
}

/// Seconds since the process started, on the clock every rank thread shares.
double now() {
  static const Clock::time_point epoch = Clock::now();
  return std::chrono::duration<double>(Clock::now() - epoch).count();
}

/// One rank's record of when its computes really ran, per stage in call order, independent of the
/// runtime's own timeline (which it cross-checks): a forward from the stage function's call to its
/// return, a B or I from when autograd reaches the stage output (a hook on it; stage 0's I too: it runs
/// the blocks' input-gradient chain the W needs, though the stage has no input gradient to send), a W
/// from the runtime's start (it runs the deferred weight GEMMs, no autograd pass).
struct ComputeClock {
  /// stage -> (start, end) of each forward; on the last stage the end is after the loss.
  std::map<int64_t, std::vector<std::pair<double, double>>> forwards;
  /// stage -> start of each B and I.
  std::map<int64_t, std::vector<double>> backward_starts;
};

/// The rank's runtime timeline (seconds from `step_start`) with every start moved to when the
/// compute really began: the k-th F (or B/I/W) of a stage in program order is the k-th call.
std::vector<titan::parallel::TimedAction> compute_only(const std::vector<titan::parallel::TimedAction>& runtime,
                                                       const ComputeClock& clock, double step_start) {
  std::map<int64_t, size_t> forward_index, backward_index;  // stage -> calls matched so far
  std::vector<titan::parallel::TimedAction> out;
  for (const auto& t : runtime) {
    const int64_t s = t.action.stage;
    double start = 0, end = step_start + t.end;
    if (t.action.op == Op::kForward) {
      const auto [begin, finish] = clock.forwards.at(s).at(forward_index[s]++);
      start = begin;
      end = std::max(end, finish);
    } else if (t.action.op == Op::kBackwardWeight) {
      // A W runs the deferred weight GEMMs without autograd reaching the stage output again; its input
      // (the I before it on this rank) is there, so the runtime's start is the compute's.
      start = step_start + t.start;
    } else {
      start = clock.backward_starts.at(s).at(backward_index[s]++);
    }
    out.push_back({.action = t.action, .start = std::min(start, end), .end = end});
  }
  return out;
}

/// What the rank threads of one configuration report.
struct RunResult {
  /// Rank 0's wall time of each timed step (zero_grad, pipeline step, clipping, AdamW).
  std::vector<double> step_seconds;
  /// Each timed step's gathered runtime timeline.
  std::vector<PipelineTimeline> runtime_timelines;
  /// Each timed step's timeline of compute only (ComputeClock), every rank, seconds from the step's start.
  std::vector<PipelineTimeline> timelines;
  /// The program every rank ran.
  PipelineProgram program;
  /// Per rank, last_stats().max_in_flight of the last step.
  std::vector<int64_t> max_in_flight;
};

RunResult run_config(const Options& o, int64_t pp, PipelineSchedule schedule, int64_t microbatches) {
  using namespace titan;
  RunResult result;
  result.max_in_flight.assign(static_cast<size_t>(pp), 0);
  result.timelines.assign(static_cast<size_t>(o.steps), PipelineTimeline(static_cast<size_t>(pp)));
  std::vector<double> step_starts(static_cast<size_t>(o.steps), 1e30);  // earliest rank's, per timed step
  std::mutex mutex;
  dist::run_local_ranks(pp, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.pp = pp}, rank, store);
    const llama3::Llama3Args args = model_args(o);
    const parallel::PipelinePlan pipeline = make_plan(o, pp, schedule);
    const int64_t last_stage = static_cast<int64_t>(pipeline.stages.size()) - 1;
    bench::PipelineRank r(args, o.seq_len, pipeline, mesh);
    auto& [model, plan, applied, params, optimizer] = r;
    parallel::Pipeline& pipe = r.pipe();
    ComputeClock clock;
    const auto on_backward = [&clock](int64_t s) {
      return [&clock, s](const at::Tensor&) { clock.backward_starts[s].push_back(now()); };
    };
    const LossFn loss = [&](const at::Tensor& logits, const at::Tensor& labels) {
      at::Tensor l = applied.cross_entropy_sum(logits, labels);  // ()
      clock.forwards[last_stage].back().second = now();
      l.register_hook(on_backward(last_stage));
      return l;
    };
    const auto stage = [&](int64_t s, const at::Tensor& x, const titan::nn::AttentionContext& context) {
      const double begin = now();
      at::Tensor y =
          model.forward_part(x, plan.pipeline.stages[static_cast<size_t>(s)], context);  // (mb, S, D) or logits
      clock.forwards[s].push_back({begin, now()});
      if (s != last_stage) y.register_hook(on_backward(s));
      return y;
    };
    std::vector<double> seconds;
    for (int64_t step = 0; step <= o.steps; ++step) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(step);  // the same batch on every rank
      const at::Tensor tokens =
          at::randint(args.vocab_size, {microbatches, o.seq_len + 1}, gen, at::kLong);  // (m, S+1)
      // Every rank starts the step together, as the runtime's timelines (each from its rank's own start) assume.
      mesh.group("pp").barrier();
      clock = {};
      const double begin = now();
      optimizer.zero_grad();
      const double step_start = now();  // the runtime's timeline starts here (to a few microseconds)
      pipe.step(stage, tokens.narrow(1, 0, o.seq_len), tokens.narrow(1, 1, o.seq_len), loss,
                1.0 / static_cast<double>(microbatches * o.seq_len));
      clip_grad_norm_(params, 1.0, &mesh);
      optimizer.step(1e-4);
      const double elapsed = now() - begin;
      PipelineTimeline runtime = pipe.gather_timeline();  // collective: outside the timed region
      if (step == 0) continue;                            // warm-up: first-touch allocations, shapes
      seconds.push_back(elapsed);
      const auto i = static_cast<size_t>(step - 1);
      std::lock_guard lock(mutex);
      result.timelines[i][static_cast<size_t>(rank)] =
          compute_only(pipe.last_timeline()[static_cast<size_t>(rank)], clock, step_start);
      step_starts[i] = std::min(step_starts[i], step_start);
      if (rank == 0) result.runtime_timelines.push_back(std::move(runtime));
    }
    std::lock_guard lock(mutex);
    result.max_in_flight[static_cast<size_t>(rank)] = pipe.last_stats().max_in_flight;
    if (rank == 0) {
      result.step_seconds = std::move(seconds);
      result.program = pipe.program(microbatches);
    }
  });
  for (size_t i = 0; i < result.timelines.size(); ++i) {
    for (auto& row : result.timelines[i]) {
      for (auto& t : row) t.start -= step_starts[i], t.end -= step_starts[i];
    }
  }
  return result;
}

/// The mean duration of each compute kind over the timelines (seconds); a kind the schedule does
/// not run is derived from the others, so the simulator never sees a zero cost.
titan::parallel::PipelineCosts mean_costs(const std::vector<PipelineTimeline>& timelines) {
  std::map<Op, std::pair<double, int64_t>> sums;  // op -> (seconds, count)
  for (const auto& timeline : timelines) {
    for (const auto& rank : timeline) {
      for (const auto& t : rank) {
        auto& [total, count] = sums[t.action.op];
        total += t.end - t.start;
        ++count;
      }
    }
  }
  const auto mean = [&](Op op) { return sums.contains(op) ? sums[op].first / sums[op].second : 0.0; };
  titan::parallel::PipelineCosts c{.forward = mean(Op::kForward),
                                   .backward = mean(Op::kBackward),
                                   .backward_input = mean(Op::kBackwardInput),
                                   .backward_weight = mean(Op::kBackwardWeight)};
  if (c.backward == 0) c.backward = c.backward_input + c.backward_weight;
  if (c.backward_input == 0) c.backward_input = c.backward_weight = c.backward / 2;
  return c;
}

/// The program's compute replayed with each (stage, kind)'s mean measured duration, ranks never
/// sharing a core and transfers free: simulate_pipeline with per-stage instead of uniform costs, so
/// it keeps the stage imbalance and drops contention and communication.
PipelineTimeline replay_per_stage(const PipelineProgram& program, const std::vector<PipelineTimeline>& timelines) {
  std::map<std::pair<int64_t, Op>, std::pair<double, int64_t>> sums;  // (stage, op) -> (seconds, count)
  for (const auto& timeline : timelines) {
    for (const auto& rank : timeline) {
      for (const auto& t : rank) {
        auto& [total, count] = sums[{t.action.stage, t.action.op}];
        total += t.end - t.start;
        ++count;
      }
    }
  }
  const auto cost = [&](const PipelineAction& a) {
    const auto& [total, count] = sums.at({a.stage, a.op});
    return total / static_cast<double>(count);
  };
  // What a compute needs before it starts: the previous stage's forward, the next stage's input
  // gradient, or its own I (a W).
  std::map<std::tuple<Op, int64_t, int64_t>, double> done;  // (op, stage, microbatch) -> end
  const auto end_of = [&](Op op, int64_t stage, int64_t mb) -> std::optional<double> {
    auto it = done.find({op, stage, mb});
    return it == done.end() ? std::nullopt : std::optional<double>(it->second);
  };
  const int64_t last = program.num_stages - 1;
  const auto ready = [&](const PipelineAction& a) -> std::optional<double> {
    if (a.op == Op::kForward) return a.stage == 0 ? 0.0 : end_of(Op::kForward, a.stage - 1, a.microbatch);
    if (a.op == Op::kBackwardWeight) return end_of(Op::kBackwardInput, a.stage, a.microbatch);
    if (a.stage == last) return 0.0;  // its forward ran earlier on this rank
    auto b = end_of(Op::kBackward, a.stage + 1, a.microbatch);
    return b ? b : end_of(Op::kBackwardInput, a.stage + 1, a.microbatch);
  };
  PipelineTimeline out(program.actions.size());
  std::vector<size_t> next(program.actions.size(), 0);
  std::vector<double> free_at(program.actions.size(), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < program.actions.size(); ++r) {
      const auto& actions = program.actions[r];
      for (; next[r] < actions.size(); ++next[r]) {
        const PipelineAction& a = actions[next[r]];
        if (!a.is_compute()) continue;
        const std::optional<double> input = ready(a);
        if (!input) break;  // waits for another rank
        const double start = std::max(free_at[r], *input);
        free_at[r] = start + cost(a);
        done[{a.op, a.stage, a.microbatch}] = free_at[r];
        out[r].push_back({.action = a, .start = start, .end = free_at[r]});
        progress = true;
      }
    }
  }
  return out;
}

/// Most (stage, microbatch) pairs the schedule lets a rank hold, as the runtime counts max_in_flight.
int64_t in_flight_bound(PipelineSchedule schedule, int64_t pp, int64_t microbatches, int64_t stages_per_rank,
                        int64_t rank) {
  switch (schedule) {
    case PipelineSchedule::gpipe:
      return microbatches;  // every forward before the first backward
    case PipelineSchedule::schedule_1f1b:
      return std::min(microbatches, pp - rank);  // p - 1 - rank warm-up forwards, then one more
    case PipelineSchedule::interleaved_1f1b:
      // Megatron: (v-1) p + 2 (p-1-rank) warm-up forwards of 1/v-sized stages, then one more.
      return std::min(stages_per_rank * microbatches, (stages_per_rank - 1) * pp + 2 * (pp - 1 - rank) + 1);
    case PipelineSchedule::zbv_zero_bubble:
      // ZB-V (Qi et al., section 6): p microbatches' worth of the rank's layers = 2p half-size stages.
      return std::min(2 * microbatches, 2 * pp);
    default:
      return -1;  // not stated here (printed as "-")
  }
}

/// Per rank, the most bytes of activations held at once: the program replayed in order.
std::vector<int64_t> peak_activation_bytes(const PipelineProgram& program, const std::vector<int64_t>& stage_bytes) {
  std::vector<int64_t> peaks;
  for (const auto& actions : program.actions) {
    int64_t live = 0, peak = 0;
    for (const PipelineAction& a : actions) {
      // An I keeps the graph (retained for its W); B and W release the microbatch's activations.
      if (a.op == Op::kForward) live += stage_bytes[static_cast<size_t>(a.stage)];
      if (a.op == Op::kBackward || a.op == Op::kBackwardWeight) live -= stage_bytes[static_cast<size_t>(a.stage)];
      peak = std::max(peak, live);
    }
    peaks.push_back(peak);
  }
  return peaks;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename T, typename F>
std::string join(const std::vector<T>& values, F&& format) {
  std::string out;
  for (const auto& v : values) out += (out.empty() ? "" : " / ") + format(v);
  return out;
}

constexpr const char* kTableHeader =
    "| pp | schedule | m | step s (median) | bubble measured, compute only: last step / mean "
    "| runtime timeline, last step | replayed (per-stage costs) | simulated (mean costs) "
    "| theoretical | mean F / B / I / W ms | F slowdown vs alone | max in flight per rank (bound) "
    "| peak activations MiB per rank |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |";

std::string mib(int64_t bytes) { return fmt::format("{:.1f}", static_cast<double>(bytes) / (1 << 20)); }

/// One row of kTableHeader: the run of (pp, schedule, m) beside its replay, simulation and bounds.
std::string table_row(int64_t pp, PipelineSchedule schedule, int64_t m, int64_t per_rank, const RunResult& run,
                      const StageProfile& profile) {
  using namespace titan::parallel;
  std::vector<double> bubbles;
  for (const auto& t : run.timelines) bubbles.push_back(bubble_fraction(t));
  double mean_bubble = 0;
  for (double b : bubbles) mean_bubble += b / static_cast<double>(bubbles.size());
  const PipelineCosts costs = mean_costs(run.timelines);
  const double simulated = bubble_fraction(simulate_pipeline(run.program, costs));
  const double replayed = bubble_fraction(replay_per_stage(run.program, run.timelines));
  // Every stage runs m forwards, so the mean forward alone is the mean over stages.
  double alone_forward = 0;
  for (double s : profile.forward_seconds) alone_forward += s / static_cast<double>(profile.forward_seconds.size());
  std::vector<std::string> in_flight;
  for (int64_t r = 0; r < pp; ++r) {
    const int64_t bound = in_flight_bound(schedule, pp, m, per_rank, r);
    in_flight.push_back(
        fmt::format("{} ({})", run.max_in_flight[static_cast<size_t>(r)], bound < 0 ? "-" : std::to_string(bound)));
  }
  // Costs of kinds the program does not run are derived (mean_costs); show them as "-".
  const auto runs = [&](Op op) {
    return std::ranges::any_of(run.program.actions, [&](const auto& rank) {
      return std::ranges::any_of(rank, [&](const auto& a) { return a.op == op; });
    });
  };
  const auto ms = [&](Op op, double seconds) { return runs(op) ? fmt::format("{:.1f}", 1e3 * seconds) : "-"; };
  return fmt::format(
      "| {} | {} | {} | {:.3f} | {:.1f}% / {:.1f}% | {:.1f}% | {:.1f}% | {:.1f}% | {:.1f}% | {} / {} / {} / {} | "
      "{:.2f}x | {} | {} |",
      pp, schedule, m, median(run.step_seconds), 100 * bubbles.back(), 100 * mean_bubble,
      100 * bubble_fraction(run.runtime_timelines.back()), 100 * replayed, 100 * simulated,
      100 * theoretical_bubble(schedule, pp, m, per_rank, costs), ms(Op::kForward, costs.forward),
      ms(Op::kBackward, costs.backward), ms(Op::kBackwardInput, costs.backward_input),
      ms(Op::kBackwardWeight, costs.backward_weight), costs.forward / alone_forward,
      join(in_flight, [](const std::string& s) { return s; }),
      join(peak_activation_bytes(run.program, profile.activation_bytes), mib));
}

/// (pp, schedule) -> the microbatch counts the schedule takes there, in the order given.
using Accepted = std::map<std::pair<int64_t, PipelineSchedule>, std::vector<int64_t>>;

/// Plans every configuration of the grid; prints each one a schedule refuses, with its reason.
Accepted plan_grid(const Options& o, const std::vector<PipelineSchedule>& schedules, int64_t* skipped) {
  Accepted accepted;
  for (int64_t pp : o.pp) {
    for (PipelineSchedule schedule : schedules) {
      for (int64_t m : o.microbatches) {
        const auto planned = plan_config(o, pp, schedule, m);
        if (const auto* reason = std::get_if<std::string>(&planned)) {
          fmt::print("skipped: pp {} {} m {}: {}\n", pp, schedule, m, *reason);
          ++*skipped;
        } else {
          accepted[{pp, schedule}].push_back(m);
        }
      }
    }
  }
  return accepted;
}

/// --dry-run: each accepted configuration's stages and its program's bubble at unit costs (F 1, B 2, I 1,
/// W 1): the plan the timed run would follow.
void print_plan(const Options& o, const std::vector<PipelineSchedule>& schedules, const Accepted& accepted) {
  using namespace titan::parallel;
  fmt::print(
      "| pp | schedule | m | stages | actions on the busiest rank | simulated bubble (F 1, B 2, I 1, W 1) | "
      "theoretical |\n| --- | --- | --- | --- | --- | --- | --- |\n");
  for (int64_t pp : o.pp) {
    for (PipelineSchedule schedule : schedules) {
      const auto it = accepted.find({pp, schedule});
      if (it == accepted.end()) continue;
      for (int64_t m : it->second) {
        const PipelineProgram program = std::get<PipelineProgram>(plan_config(o, pp, schedule, m));
        size_t busiest = 0;
        for (const auto& actions : program.actions) busiest = std::max(busiest, actions.size());
        fmt::print("| {} | {} | {} | {} | {} | {:.1f}% | {:.1f}% |\n", pp, schedule, m, program.num_stages, busiest,
                   100 * bubble_fraction(simulate_pipeline(program)),
                   100 * theoretical_bubble(schedule, pp, m, program.num_stages / pp, PipelineCosts{}));
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace titan;
  try {
    const Options o = parse(argc, argv);
    const std::vector<PipelineSchedule> schedules = parse_schedules(o.schedules);
    TITAN_CHECK_VALUE(o.steps >= 1, "[bench_pipeline] expected --steps >= 1, got {}.", o.steps);
    split_by(o.split);  // a bad --split fails here, not as every configuration refused
    if (o.dry_run) {
      fmt::print("pipeline plan: {} ({} blocks) seq_len {}, split by {}\n\n", o.flavor, model_args(o).n_layers,
                 o.seq_len, o.split);
    } else {
      fmt::print(
          "pipeline bubble: {} ({} blocks) seq_len {}, split by {}, 1 sequence per microbatch, {} timed steps after "
          "1 warm-up, ranks as threads (Gloo), 1 intra-op thread/rank, {} hardware threads\n\n",
          o.flavor, model_args(o).n_layers, o.seq_len, o.split, o.steps, std::thread::hardware_concurrency());
    }
    int64_t skipped = 0;
    const Accepted accepted = plan_grid(o, schedules, &skipped);
    const auto total = static_cast<int64_t>(o.pp.size() * schedules.size() * o.microbatches.size());
    if (o.dry_run) {
      print_plan(o, schedules, accepted);
      fmt::print("\ndry run: {} of {} configurations planned, {} skipped, nothing timed\n", total - skipped, total,
                 skipped);
      return 0;
    }
    at::set_num_threads(1);
    fmt::print("{}\n", kTableHeader);
    std::fflush(stdout);
    std::vector<std::string> notes;  // per (pp, schedule), printed under the table
    for (int64_t pp : o.pp) {
      for (PipelineSchedule schedule : schedules) {
        const auto it = accepted.find({pp, schedule});
        if (it == accepted.end()) continue;
        const parallel::PipelinePlan plan = make_plan(o, pp, schedule);
        const StageProfile profile = profile_stages(o, plan);
        const int64_t stages = static_cast<int64_t>(plan.stages.size());
        const int64_t per_rank = stages / pp;
        for (int64_t m : it->second) {
          const RunResult run = run_config(o, pp, schedule, m);
          fmt::print("{}\n", table_row(pp, schedule, m, per_rank, run, profile));
          std::fflush(stdout);
          if (!o.svg_dir.empty()) {
            std::filesystem::create_directories(o.svg_dir);
            const std::string name = fmt::format("pp{}_{}_m{}", pp, schedule, m);
            std::ofstream(std::filesystem::path(o.svg_dir) / (name + ".svg"))
                << parallel::render_timeline_svg(run.timelines.back(), name + " (measured, last step)");
          }
        }
        const parallel::PipelinePlan torchtitan = make_plan(o, pp, schedule, PipelineSplitBy::layers);
        notes.push_back(fmt::format(
            "{} pp {}: {} stages; largest stage's FLOPs over the mean: {:.3f} ({} split), {:.3f} (torchtitan's "
            "default split); one microbatch's activations per stage, MiB: {}; one forward alone, ms: {}",
            schedule, pp, stages, flops_imbalance(o, plan.stages), o.split, flops_imbalance(o, torchtitan.stages),
            join(profile.activation_bytes, mib),
            join(profile.forward_seconds, [](double s) { return fmt::format("{:.1f}", 1e3 * s); })));
      }
    }
    fmt::print("\n");
    for (const std::string& note : notes) fmt::print("{}\n", note);
    fmt::print("{} of {} configurations timed, {} skipped\n", total - skipped, total, skipped);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_pipeline: {}\n", error_message(e));
    return 1;
  }
}
