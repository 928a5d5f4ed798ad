// SPDX-License-Identifier: BSD-3-Clause
// Data-parallel benchmark: N ranks as threads of one process (Gloo over loopback, one intra-op
// thread each) train a Llama 3 flavor with FSDP or DDP. Prints tokens/s per rank, the median step
// time, and the bytes each rank sent per step next to the theory (ring volumes, as a multiple of the
// parameter bytes P): FSDP = all-gather fwd + all-gather bwd + reduce-scatter = 3(N-1)/N P, DDP =
// all-reduce = 2(N-1)/N P. Gloo emulates reduce-scatter with an all-reduce, so its measured FSDP
// volume is 4(N-1)/N P; both columns are printed. On this 2-core machine N ranks share 2 cores, so
// per-rank throughput falls with N: the numbers show overhead, not scaling. --reshard-after-forward always
// is torchtitan 0.2.2's apply_fsdp rule (titan's default also keeps the last block gathered); --overlap 0
// turns off FSDP's prefetch and waits each reduce-scatter where it is issued. Run:
//   build/bin/bench_data_parallel --flavor debugmodel --ranks 1,2,4 --mode fsdp --seq-len 256 --batch 2
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "bench_flags.hpp"
#include "titan/core/choices.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/optim/clip.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/step.hpp"

namespace {

struct Options {
  std::string flavor = "debugmodel";              ///< Llama 3 flavor
  std::vector<int64_t> ranks{1, 2, 4};            ///< world sizes to run
  std::string mode = "fsdp";                      ///< fsdp or ddp
  int64_t seq_len = 256;                          ///< tokens per sequence
  int64_t batch = 2;                              ///< sequences per rank per step
  int64_t steps = 5;                              ///< timed steps (after 1 warmup step)
  std::string reshard_after_forward = "default";  ///< FSDP policy: default, always (torchtitan 0.2.2's), never
  int64_t overlap = 1;                            ///< 0: no FSDP prefetch, reduce-scatters waited where issued
};

Options parse(int argc, char** argv) {
  Options o;
  titan::bench::parse_flags(argc, argv, "bench_data_parallel",
                            {{"--flavor", &o.flavor},
                             {"--ranks", &o.ranks},
                             {"--mode", &o.mode},
                             {"--seq-len", &o.seq_len},
                             {"--batch", &o.batch},
                             {"--steps", &o.steps},
                             {"--reshard-after-forward", &o.reshard_after_forward},
                             {"--overlap", &o.overlap}});
  TITAN_CHECK_VALUE(titan::parse_choice<titan::ReshardAfterForward>(o.reshard_after_forward).has_value(),
                    "[bench_data_parallel] expected --reshard-after-forward {}, got '{}'.",
                    titan::choice_list<titan::ReshardAfterForward>(), o.reshard_after_forward);
  TITAN_CHECK_VALUE(o.mode == "fsdp" || o.mode == "ddp", "[bench_data_parallel] expected --mode fsdp or ddp, got '{}'.",
                    o.mode);
  return o;
}

struct RankResult {
  std::vector<double> step_seconds;
  titan::dist::CommStats comm;  // per step, averaged over the timed steps
  int64_t param_bytes = 0;      // whole model
};

RankResult run_rank(const Options& o, const titan::dist::Mesh& mesh) {
  using namespace titan;
  const llama3::Llama3Args args = llama3::flavor(o.flavor);
  nn::manual_init_seed(0);
  llama3::Llama3 model(args, o.seq_len, at::TensorOptions());
  RankResult result;
  result.param_bytes = llama3::Llama3(args, o.seq_len, at::TensorOptions().device(at::kMeta)).num_params() * 4;
  parallel::ParallelPlan plan = parallel::plan(model.sharding_spec(), {}, mesh.shape());
  plan.data_parallel.options.reshard_after_forward = *parse_choice<ReshardAfterForward>(o.reshard_after_forward);
  plan.data_parallel.options.overlap = o.overlap != 0;
  const Parallelized parallel = parallelize(model, mesh, plan);
  model.init_weights();
  const auto params = model.unique_parameters();
  AdamW optimizer(params, {.lr = 1e-4});
  const dist::ProcessGroup& group = mesh.group(o.mode == "fsdp" ? "dp_shard" : "dp_replicate");
  for (int64_t step = 0; step <= o.steps; ++step) {
    if (step == 1) group.reset_stats();
    const at::Tensor tokens = at::randint(args.vocab_size, {o.batch, o.seq_len + 1}, at::kLong);  // (B, S+1)
    const auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    forward_backward([&](const at::Tensor& t, const titan::nn::AttentionContext& c) { return model.forward(t, c); },
                     {{tokens.narrow(1, 0, o.seq_len), tokens.narrow(1, 1, o.seq_len)}}, at::kCPU,
                     o.batch * o.seq_len * mesh.size("dp"));
    clip_grad_norm_(params, 1.0, &mesh);
    optimizer.step(1e-4);
    if (step > 0)
      result.step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const dist::CommStats total = group.stats();
  result.comm = {.all_gather_bytes = total.all_gather_bytes / o.steps,
                 .reduce_scatter_bytes = total.reduce_scatter_bytes / o.steps,
                 .all_reduce_bytes = total.all_reduce_bytes / o.steps,
                 .other_bytes = total.other_bytes / o.steps,
                 .calls = total.calls / o.steps};
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace titan;
  try {
    const Options o = parse(argc, argv);
    at::set_num_threads(1);
    fmt::print(
        "{} {} seq_len {} batch/rank {} ({} timed steps, ranks as threads, Gloo, 1 intra-op thread/rank, "
        "reshard_after_forward {}, overlap {})\n",
        o.mode, o.flavor, o.seq_len, o.batch, o.steps, o.reshard_after_forward, o.overlap != 0 ? "on" : "off");
    fmt::print("{:>5} {:>12} {:>12} {:>10} {:>12} {:>12} {:>12} {:>10} {:>10}\n", "ranks", "tok/s/rank", "tok/s total",
               "step(med)", "AG MB/step", "RS MB/step", "AR MB/step", "sent/P", "theory/P");
    for (int64_t n : o.ranks) {
      const dist::MeshShape shape =
          o.mode == "fsdp" ? dist::MeshShape{.dp_shard = n} : dist::MeshShape{.dp_replicate = n};
      std::vector<RankResult> results(static_cast<size_t>(n));
      std::mutex mutex;
      dist::run_local_ranks(n, [&](int64_t rank, const dist::Store& store) {
        const dist::Mesh mesh = n == 1 ? dist::Mesh() : dist::Mesh(shape, rank, store);
        RankResult r = run_rank(o, mesh);
        std::lock_guard lock(mutex);
        results[static_cast<size_t>(rank)] = std::move(r);
      });
      auto times = results[0].step_seconds;
      std::sort(times.begin(), times.end());
      const double median = times[times.size() / 2];
      const double tps_rank = static_cast<double>(o.batch * o.seq_len) / median;
      const auto& c = results[0].comm;
      const double p = static_cast<double>(results[0].param_bytes);
      const double frac = static_cast<double>(n - 1) / static_cast<double>(n);
      const double theory = o.mode == "fsdp" ? 3 * frac : 2 * frac;
      const double mb = 1024.0 * 1024.0;
      fmt::print(
          "{:>5} {:>12.0f} {:>12.0f} {:>9.3f}s {:>12.1f} {:>12.1f} {:>12.1f} {:>10.2f} {:>10}\n", n, tps_rank,
          tps_rank * static_cast<double>(n), median, static_cast<double>(c.all_gather_bytes) / mb,
          static_cast<double>(c.reduce_scatter_bytes) / mb, static_cast<double>(c.all_reduce_bytes) / mb,
          static_cast<double>(c.total()) / p,
          o.mode == "fsdp" ? fmt::format("{:.2f} ({:.2f} Gloo)", theory, 4 * frac) : fmt::format("{:.2f}", theory));
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_data_parallel: {}\n", error_message(e));
    return 1;
  }
}
