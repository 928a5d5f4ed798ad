// SPDX-License-Identifier: BSD-3-Clause
// DualPipeV with its forward/backward pairs overlapped (PipelinePlan::overlap_f_b: the backward on a
// second thread) against the same program run one action after the other. A Llama 3 flavor cut into
// 2 pp stages per rank, ranks as threads of one process (Gloo over loopback), one sequence per
// microbatch, `--threads` intra-op threads per rank thread (and per pair thread). Per mode: the median
// wall time of the timed steps (zero_grad, pipeline step, clipping, AdamW; rank 0's clock), rank 0's
// overlapped pairs and the seconds it waited for a neighbour's tensor; the two modes' losses must agree
// to the bit, which the bench checks.
//
//   build/bin/bench_pipeline_overlap --pp 2 --microbatches 8 --flavor debugmodel --seq-len 256 --steps 5
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "bench_flags.hpp"
#include "pipeline_rank.hpp"
#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/optim/clip.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/parallel/planner.hpp"

namespace {

struct Options {
  int64_t pp = 2;                               ///< pipeline degree (ranks as threads)
  int64_t microbatches = 8;                     ///< microbatches per step (1 sequence each; DualPipeV needs >= 2 pp)
  std::string flavor = "debugmodel";            ///< Llama 3 flavor
  int64_t seq_len = 256;                        ///< tokens per sequence
  int64_t steps = 5;                            ///< timed steps per mode (after 1 warm-up step)
  int64_t threads = 1;                          ///< intra-op threads of each rank thread
  std::string modes = "sequential,overlapped";  ///< which modes to run, in this order
};

struct ModeResult {
  std::vector<double> step_seconds;  // rank 0's wall time per timed step
  std::vector<double> losses;        // per step (warm-up included), the same on every rank
  int64_t overlapped_pairs = 0;      // rank 0, last step
  double wait_seconds = 0;           // rank 0, last step
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

ModeResult run(const Options& o, bool overlap) {
  using namespace titan;
  ModeResult result;
  std::mutex mutex;
  dist::run_local_ranks(o.pp, [&](int64_t rank, const dist::Store& store) {
    at::set_num_threads(static_cast<int>(o.threads));
    const dist::Mesh mesh({.pp = o.pp}, rank, store);
    const llama3::Llama3Args args = llama3::flavor(o.flavor);
    ParallelismConfig parallelism;
    parallelism.pipeline_parallel_schedule = PipelineSchedule::dual_pipe_v;
    parallelism.pipeline_parallel_expert_parallel_overlap = overlap;
    const parallel::ShardingSpec spec = llama3::Llama3::build(args)->sharding_spec();
    const parallel::PipelinePlan pipeline =
        parallel::pipeline_plan(spec.pipeline, spec.pipeline_costs, o.pp, parallelism);
    bench::PipelineRank r(args, o.seq_len, pipeline, mesh);
    auto& [model, plan, applied, params, optimizer] = r;
    parallel::Pipeline& pipe = r.pipe();
    const auto stage = [&](int64_t s, const at::Tensor& x, const nn::AttentionContext& context) {
      return model.forward_part(x, plan.pipeline.stages[static_cast<size_t>(s)], context);
    };
    const LossFn loss = [&](const at::Tensor& logits, const at::Tensor& labels) {
      return applied.cross_entropy_sum(logits, labels);
    };
    std::vector<double> seconds, losses;
    for (int64_t step = 0; step <= o.steps; ++step) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(step);  // the same batch on every rank
      const at::Tensor tokens =
          at::randint(args.vocab_size, {o.microbatches, o.seq_len + 1}, gen, at::kLong);  // (m, S+1)
      mesh.group("pp").barrier();
      const auto begin = std::chrono::steady_clock::now();
      optimizer.zero_grad();
      losses.push_back(pipe.step(stage, tokens.narrow(1, 0, o.seq_len), tokens.narrow(1, 1, o.seq_len), loss,
                                 1.0 / static_cast<double>(o.microbatches * o.seq_len)));
      clip_grad_norm_(params, 1.0, &mesh);
      optimizer.step(1e-4);
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - begin;
      if (step > 0) seconds.push_back(elapsed.count());  // step 0 warms up: first-touch allocations, shapes
    }
    if (rank != 0) return;
    std::lock_guard lock(mutex);
    result.step_seconds = std::move(seconds);
    result.losses = std::move(losses);
    result.overlapped_pairs = pipe.last_stats().overlapped_pairs;
    result.wait_seconds = pipe.last_stats().wait_seconds;
  });
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace titan;
  try {
    Options o;
    bench::parse_flags(argc, argv, "bench_pipeline_overlap",
                       {{"--pp", &o.pp},
                        {"--microbatches", &o.microbatches},
                        {"--flavor", &o.flavor},
                        {"--seq-len", &o.seq_len},
                        {"--steps", &o.steps},
                        {"--threads", &o.threads},
                        {"--modes", &o.modes}});
    TITAN_CHECK_VALUE(o.steps >= 1 && o.threads >= 1,
                      "[bench_pipeline_overlap] expected --steps >= 1 and --threads >= 1, got {} and {}.", o.steps,
                      o.threads);
    fmt::print(
        "DualPipeV F/B overlap: {} seq_len {}, pp {}, {} microbatches of 1 sequence, {} timed steps after 1 "
        "warm-up, ranks as threads (Gloo), {} intra-op thread(s) per rank thread, {} hardware threads\n\n",
        o.flavor, o.seq_len, o.pp, o.microbatches, o.steps, o.threads, std::thread::hardware_concurrency());
    fmt::print("| mode | step s (median) | steps s | pairs overlapped (rank 0) | rank 0 waited s |\n");
    fmt::print("|---|---|---|---|---|\n");
    std::vector<ModeResult> results;
    for (const std::string mode : {"sequential", "overlapped"}) {
      if (o.modes.find(mode) == std::string::npos) continue;
      results.push_back(run(o, mode == "overlapped"));
      const ModeResult& r = results.back();
      fmt::print("| {} | {:.3f} | {:.3f} | {} | {:.3f} |\n", mode, median(r.step_seconds),
                 fmt::join(r.step_seconds, ", "), r.overlapped_pairs, r.wait_seconds);
      std::fflush(stdout);
    }
    if (results.size() == 2) {
      fmt::print("\noverlapped / sequential step time: {:.3f}; losses bitwise equal: {}\n",
                 median(results[1].step_seconds) / median(results[0].step_seconds),
                 results[0].losses == results[1].losses ? "yes" : "NO");
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_pipeline_overlap: {}\n", error_message(e));
    return 1;
  }
}
