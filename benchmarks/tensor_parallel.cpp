// SPDX-License-Identifier: BSD-3-Clause
// Tensor-parallel benchmark: TP over N ranks as threads of one process (Gloo over loopback, one
// intra-op thread each) trains a Llama 3 flavor on one batch per step (every TP rank sees the same
// batch). Prints tokens/s of the group, the median step time, and the bytes each rank sent per
// transformer block per step, measured as (bytes at L layers - bytes at L/2 layers) / (L/2), next
// to the theory. Per block, forward + backward, with A = B*S*D*4 the block's activation bytes:
//   sequence parallel: 4 all-gathers + 4 reduce-scatters of A  -> 8 (N-1)/N A (ring volumes)
//   plain TP         : 4 all-reduces of A                      -> 8 (N-1)/N A
// Gloo emulates reduce-scatter with an all-reduce (2 (N-1)/N A each), so its SP figure is 12 (N-1)/N A;
// both are printed. The norm weights' gradient all-reduce (2 D floats per block) is included. Run:
//   build/bin/bench_tensor_parallel --flavor debugmodel --ranks 1,2 --seq-len 256 --batch 4 [--async 1]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "bench_flags.hpp"
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
  std::string flavor = "debugmodel";  ///< Llama 3 flavor
  std::vector<int64_t> ranks{1, 2};   ///< TP degrees to run
  bool sequence_parallel = true;      ///< SP + loss parallel, or plain TP
  bool async = false;                 ///< async TP (collectives overlapped over 2 batch chunks)
  int64_t seq_len = 256;              ///< tokens per sequence
  int64_t batch = 4;                  ///< sequences per step (the same on every TP rank)
  int64_t steps = 5;                  ///< timed steps (after 1 warmup step)
};

Options parse(int argc, char** argv) {
  Options o;
  titan::bench::parse_flags(argc, argv, "bench_tensor_parallel",
                            {{"--flavor", &o.flavor},
                             {"--ranks", &o.ranks},
                             {"--sequence-parallel", &o.sequence_parallel},
                             {"--async", &o.async},
                             {"--seq-len", &o.seq_len},
                             {"--batch", &o.batch},
                             {"--steps", &o.steps}});
  return o;
}

struct RankResult {
  std::vector<double> step_seconds;
  int64_t bytes_per_step = 0;  // sent through the tp group, averaged over the timed steps
};

RankResult run_rank(const Options& o, const titan::dist::Mesh& mesh, int64_t n_layers) {
  using namespace titan;
  llama3::Llama3Args args = llama3::flavor(o.flavor);
  args.n_layers = n_layers;
  nn::manual_init_seed(0);
  llama3::Llama3 model(args, o.seq_len, at::TensorOptions());
  parallel::ParallelPlan plan = parallel::plan(model.sharding_spec(), {}, mesh.shape());
  if (mesh.size("tp") > 1) {
    plan.tensor_parallel = parallel::tensor_parallel_plan(model.sharding_spec(), mesh.size("tp"), o.sequence_parallel,
                                                          /*loss_parallel=*/o.sequence_parallel);
    plan.tensor_parallel.async = o.async;
  }
  const Parallelized parallel = parallelize(model, mesh, plan);
  model.init_weights();
  const LossFn loss = [&parallel](const at::Tensor& l, const at::Tensor& y) {
    return parallel.cross_entropy_sum(l, y);
  };
  const auto params = model.unique_parameters();
  AdamW optimizer(params, {.lr = 1e-4});
  const dist::ProcessGroup& group = mesh.group("tp");
  RankResult result;
  for (int64_t step = 0; step <= o.steps; ++step) {
    if (step == 1) group.reset_stats();
    auto gen = at::make_generator<at::CPUGeneratorImpl>(step);  // the same batch on every rank
    const at::Tensor tokens = at::randint(args.vocab_size, {o.batch, o.seq_len + 1}, gen, at::kLong);  // (B, S+1)
    const auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    forward_backward([&](const at::Tensor& t, const titan::nn::AttentionContext& c) { return model.forward(t, c); },
                     {{tokens.narrow(1, 0, o.seq_len), tokens.narrow(1, 1, o.seq_len)}}, at::kCPU, 0, false, loss);
    clip_grad_norm_(params, 1.0, &mesh);
    optimizer.step(1e-4);
    if (step > 0)
      result.step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  result.bytes_per_step = group.stats().total() / o.steps;
  return result;
}

std::vector<RankResult> run_all(const Options& o, int64_t n, int64_t n_layers) {
  std::vector<RankResult> results(static_cast<size_t>(n));
  std::mutex mutex;
  titan::dist::run_local_ranks(n, [&](int64_t rank, const titan::dist::Store& store) {
    const titan::dist::Mesh mesh = n == 1 ? titan::dist::Mesh() : titan::dist::Mesh({.tp = n}, rank, store);
    RankResult r = run_rank(o, mesh, n_layers);
    std::lock_guard lock(mutex);
    results[static_cast<size_t>(rank)] = std::move(r);
  });
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace titan;
  try {
    const Options o = parse(argc, argv);
    at::set_num_threads(1);
    const llama3::Llama3Args args = llama3::flavor(o.flavor);
    fmt::print("{}TP{} {} seq_len {} batch {} ({} timed steps, ranks as threads, Gloo, 1 intra-op thread/rank)\n",
               o.async ? "async " : "", o.sequence_parallel ? " + SP + loss parallel" : "", o.flavor, o.seq_len,
               o.batch, o.steps);
    fmt::print("{:>5} {:>12} {:>10} {:>16} {:>16} {:>22}\n", "ranks", "tok/s", "step(med)", "MB/block/step",
               "measured/A", "theory/A");
    const double activation = static_cast<double>(o.batch * o.seq_len * args.dim * 4);  // A
    for (int64_t n : o.ranks) {
      auto full = run_all(o, n, args.n_layers);
      auto times = full[0].step_seconds;
      std::sort(times.begin(), times.end());
      const double median = times[times.size() / 2];
      const int64_t half_layers = args.n_layers / 2;
      double per_block = 0;
      if (n > 1) {
        const auto half = run_all(o, n, args.n_layers - half_layers);
        per_block =
            static_cast<double>(full[0].bytes_per_step - half[0].bytes_per_step) / static_cast<double>(half_layers);
      }
      const double frac = static_cast<double>(n - 1) / static_cast<double>(n);
      const std::string theory = o.sequence_parallel ? fmt::format("{:.2f} ({:.2f} Gloo)", 8 * frac, 12 * frac)
                                                     : fmt::format("{:.2f}", 8 * frac);
      fmt::print("{:>5} {:>12.0f} {:>9.3f}s {:>16.2f} {:>16.2f} {:>22}\n", n,
                 static_cast<double>(o.batch * o.seq_len) / median, median, per_block / (1024.0 * 1024.0),
                 per_block / activation, theory);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_tensor_parallel: {}\n", error_message(e));
    return 1;
  }
}
