// SPDX-License-Identifier: BSD-3-Clause
// Activation checkpointing benchmark: a stack of Llama 3 blocks (debugmodel's shape at a chosen width,
// fp32 on CPU), forward + backward of a (B, S, D) input under each AC mode. Per mode:
//   - kept: the bytes the forward leaves alive until backward (saved activations, checkpoint inputs,
//     kept op outputs, the output), booked by a wrapping CPU allocator (rank_memory.hpp);
//   - peak: the highest live bytes above the start during forward + backward (parameter gradients
//     already exist from a warm-up step, so only the step's transients count);
//   - the median forward + backward time, and its cost over no AC.
// Beside them, the analytic bound for full AC: every block's input (L T D) plus one block's
// activations, counted from the ops each block runs and what their backward keeps (T = B S tokens):
//   attention_norm: rstd (T), x*rstd (T D), its output (T D, read by wq/wk/wv)
//   RoPE'd q (T D) and k (T KVD), v (T KVD), attention's output (T D) and log-sum-exp (T H)
//   the residual (T D), ffn_norm: rstd (T), x*rstd (T D), its output (T D)
//   w1's output (T F, read by silu), silu's (T F), w3's (T F), their product (T F, read by w2)
// = T (2 + 7 D + 2 KVD + H + 4 F) elements per block. Full AC's peak also holds the gradients in
// flight through one block's backward, which every mode has: measured as no AC's rise above its kept
// bytes, and taken off the peak for the comparison with the bound.
// Run:
//   build/bin/bench_activation_checkpoint --dim 512 --seq 2048 --batch 4 --iters 3
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "bench_flags.hpp"
#include "rank_memory.hpp"
#include "titan/core/config.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/llama3/args.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

struct Options {
  int64_t dim = 512;
  int64_t layers = 6;  // debugmodel's
  int64_t heads = 16;  // debugmodel's
  int64_t seq = 2048;
  int64_t batch = 4;
  int64_t iters = 3;
  std::string modes = "none,selective:2,selective:op,full";
};

Options parse(int argc, char** argv) {
  Options o;
  titan::bench::parse_flags(argc, argv, "bench_activation_checkpoint",
                            {{"--dim", &o.dim},
                             {"--layers", &o.layers},
                             {"--heads", &o.heads},
                             {"--seq", &o.seq},
                             {"--batch", &o.batch},
                             {"--iters", &o.iters},
                             {"--modes", &o.modes}});
  return o;
}

// The blocks of a Llama 3 model only (a model part named as the model, "layers.N"), so the model's AC
// plan applies and nothing else is timed.
std::vector<std::string> block_paths(const titan::llama3::Llama3Args& args) {
  std::vector<std::string> paths;
  for (int64_t i = 0; i < args.n_layers; ++i) paths.push_back("layers." + std::to_string(i));
  return paths;
}

struct Mode {
  std::string name;
  titan::ActivationCheckpointConfig config{};
};

std::vector<Mode> parse_modes(const std::string& list) {
  std::vector<Mode> modes;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    Mode m{.name = item};
    if (item == "none") {
      m.config.mode = titan::AcMode::none;
    } else if (item == "full") {
      m.config.mode = titan::AcMode::full;
    } else if (item.starts_with("selective:")) {
      m.config.mode = titan::AcMode::selective;
      m.config.selective_ac_option = item.substr(std::string("selective:").size());
    } else {
      TITAN_CHECK_VALUE(false,
                        "[bench_activation_checkpoint] expected --modes of none, full, selective:N, selective:op, "
                        "got '{}'.",
                        item);
    }
    modes.push_back(m);
  }
  return modes;
}

struct Result {
  int64_t kept = 0;    // bytes alive after forward
  int64_t peak = 0;    // highest live bytes above the start, forward + backward
  double seconds = 0;  // median forward + backward
};

Result run(const titan::llama3::Llama3Args& args, const Options& o, const Mode& mode) {
  titan::bench::RankMemory& memory = titan::bench::RankMemory::install();
  titan::bench::RankMemory::set_thread_rank(0);
  titan::nn::manual_init_seed(1);
  const std::vector<std::string> paths = block_paths(args);
  titan::llama3::Llama3 blocks(args, o.seq, at::TensorOptions(), paths);
  blocks.init_weights();
  titan::parallel::ParallelPlan plan{.activation_checkpoint = titan::parallel::activation_checkpoint_plan(
                                         titan::llama3::Llama3::build(args)->sharding_spec().blocks, mode.config,
                                         /*has_moe=*/false)};
  const titan::Parallelized applied = titan::parallelize(blocks, titan::dist::Mesh(), plan);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor x = at::randn({o.batch, o.seq, args.dim}, gen);          // (B, S, D)
  const at::Tensor grad = at::randn({o.batch, o.seq, args.dim}, gen) / 64;  // (B, S, D)
  Result r;
  std::vector<double> times;
  for (int64_t i = 0; i <= o.iters; ++i) {  // the first run creates the parameter gradients
    const at::Tensor input = x.clone().requires_grad_(true);
    const int64_t before = memory.live(0);
    memory.reset_peak(0);
    const auto start = Clock::now();
    at::Tensor y = blocks.forward_part(input, paths);
    const int64_t kept = memory.live(0) - before;
    y.backward(grad);
    y.reset();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (i == 0) continue;
    times.push_back(seconds);
    r.kept = kept;
    r.peak = memory.peak(0) - before;
  }
  std::sort(times.begin(), times.end());
  r.seconds = times[times.size() / 2];
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    TITAN_CHECK_VALUE(o.iters >= 1, "[bench_activation_checkpoint] expected --iters >= 1, got {}.", o.iters);
    const titan::llama3::Llama3Args args{
        .dim = o.dim, .n_layers = o.layers, .n_heads = o.heads, .vocab_size = 2048, .rope_theta = 500000};
    const int64_t T = o.batch * o.seq, D = args.dim, H = args.n_heads, F = args.ffn_hidden_dim();
    const int64_t KVD = args.n_kv_heads.value_or(H) * (D / H);
    const double input_bytes = 4.0 * static_cast<double>(T * D);
    const double block_bytes = 4.0 * static_cast<double>(T * (2 + 7 * D + 2 * KVD + H + 4 * F));
    const double full_bound = static_cast<double>(o.layers) * input_bytes + block_bytes;
    fmt::print("{} Llama 3 blocks dim {} heads {} ffn {}, batch {} x seq {}, fp32, {} intra-op threads\n", o.layers, D,
               H, F, o.batch, o.seq, at::get_num_threads());
    fmt::print(
        "analytic: one block's activations {:.1f} MiB, each block's input {:.1f} MiB; full AC bound {:.1f} MiB\n",
        block_bytes / kMiB, input_bytes / kMiB, full_bound / kMiB);
    fmt::print(
        "| mode | kept after forward MiB | peak fwd+bwd MiB | fwd+bwd s | time vs none |\n|---|---|---|---|---|\n");
    double none_seconds = 0;
    std::optional<int64_t> working_set;  // no AC's rise above its kept bytes in backward: gradients in flight
    for (const Mode& mode : parse_modes(o.modes)) {
      const Result r = run(args, o, mode);
      if (mode.config.mode == titan::AcMode::none) {
        none_seconds = r.seconds;
        working_set = r.peak - r.kept;
      }
      fmt::print("| {} | {:.1f} | {:.1f} | {:.2f} | {} |\n", mode.name, r.kept / kMiB, r.peak / kMiB, r.seconds,
                 none_seconds > 0 ? fmt::format("{:+.0f}%", 100.0 * (r.seconds / none_seconds - 1)) : "-");
      if (mode.config.mode == titan::AcMode::full) {
        fmt::print("full AC peak / analytic bound = {:.3f}\n", static_cast<double>(r.peak) / full_bound);
        if (working_set) {
          // The peak also holds the gradients in flight through one block's backward, which every mode has.
          fmt::print("full AC activations (peak - backward working set {:.1f} MiB) / analytic bound = {:.3f}\n",
                     *working_set / kMiB, static_cast<double>(r.peak - *working_set) / full_bound);
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
