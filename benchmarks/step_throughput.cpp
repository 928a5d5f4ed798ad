// SPDX-License-Identifier: BSD-3-Clause
// Step-throughput benchmark: full training steps (forward, backward, clipping, fused AdamW) of a Llama 3
// flavor; prints tokens/s, TFLOPs and MFU (torchtitan's 6N + 12*L*D*S formula) against the declared
// peak and, on CPU, against a measured GEMM peak of the same threads and dtype. One process is one rank;
// under a launcher (titan-run, torchrun) with WORLD_SIZE > 1 the ranks shard the model with FSDP
// (dp_shard = world size, Gloo on CPU), as the Python peer in benchmarks/peers/peer_step.py does.
// benchmarks/peers/run_peers.sh runs both alternately. Precision: --mixed-precision bf16 (one rank: CPU or
// CUDA autocast; FSDP: bf16 gathered parameters, fp32 reduce) and --float8 <recipe> (every Linear but the
// output head). Memory: after the timed steps one more step runs with the allocator's peak restarted;
// the JSON has its peak allocator bytes, the training state's bytes (parameters, gradients, optimizer
// state) and the process's peak RSS. --reshard-after-forward always is torchtitan 0.2.2's apply_fsdp rule;
// --overlap 0 makes every FSDP collective wait where it is issued. Run:
//   build/bin/bench_step_throughput --flavor debugmodel --seq-len 512 --batch 8 --steps 10
//   build/bin/titan-run --nproc-per-node 2 build/bin/bench_step_throughput --flavor 100M --threads 1
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_flags.hpp"
#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/dist/launch_env.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/float8/converter.hpp"
#include "titan/metrics/metrics.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/bf16_gemm.hpp"
#include "titan/nn/init.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/optim/clip.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/step.hpp"

namespace {

struct Options {
  std::string flavor = "debugmodel";  ///< Llama 3 flavor (titan::llama3::flavor)
  int64_t n_layers = 0;               ///< override the flavor's block count (0: keep it)
  int64_t tie_embeddings = -1;        ///< override weight tying: 0 or 1 (-1: keep the flavor's)
  int64_t seq_len = 512;              ///< tokens per sequence S
  int64_t batch = 8;                  ///< sequences per rank per step B
  int64_t steps = 10;                 ///< timed steps
  int64_t warmup = 2;                 ///< untimed steps before them
  int64_t threads = 0;                ///< intra-op threads (at::set_num_threads); 0: LibTorch's default
  std::string device = "cpu";         ///< cpu or cuda (cuda: bf16 autocast, fp32 master weights)
  std::string collectives = "auto";   ///< FSDP collective layout: auto, flat or per_param
  titan::parallel::DataParallelCollectives collectives_choice{};  ///< collectives, parsed
  std::string mixed_precision = "fp32";           ///< fp32 or bf16 (autocast on one rank, FSDP param dtype on more)
  std::string float8 = "none";                    ///< none or a float8 recipe: tensorwise, rowwise, rowwise_with_gw_hp
  std::string reshard_after_forward = "default";  ///< FSDP policy: default, always (torchtitan's), never
  int64_t overlap = 1;                            ///< 0: no FSDP prefetch, every reduce-scatter waited at once
  std::string json;                               ///< write the result here (rank 0) when not empty
};

Options parse(int argc, char** argv) {
  Options o;
  titan::bench::parse_flags(argc, argv, "bench_step_throughput",
                            {{"--flavor", &o.flavor},
                             {"--n-layers", &o.n_layers},
                             {"--tie-embeddings", &o.tie_embeddings},
                             {"--seq-len", &o.seq_len},
                             {"--batch", &o.batch},
                             {"--steps", &o.steps},
                             {"--warmup", &o.warmup},
                             {"--threads", &o.threads},
                             {"--device", &o.device},
                             {"--collectives", &o.collectives},
                             {"--mixed-precision", &o.mixed_precision},
                             {"--float8", &o.float8},
                             {"--reshard-after-forward", &o.reshard_after_forward},
                             {"--overlap", &o.overlap},
                             {"--json", &o.json}});
  TITAN_CHECK_VALUE(o.steps > 0, "[bench_step_throughput] expected --steps > 0, got {}.", o.steps);
  TITAN_CHECK_VALUE(o.device == "cpu" || o.device == "cuda",
                    "[bench_step_throughput] expected --device cpu or cuda, got '{}'.", o.device);
  const auto collectives = titan::parse_choice<titan::parallel::DataParallelCollectives>(o.collectives);
  TITAN_CHECK_VALUE(collectives.has_value(), "[bench_step_throughput] expected --collectives {}, got '{}'.",
                    titan::choice_list<titan::parallel::DataParallelCollectives>(), o.collectives);
  o.collectives_choice = *collectives;
  TITAN_CHECK_VALUE(o.mixed_precision == "fp32" || o.mixed_precision == "bf16",
                    "[bench_step_throughput] expected --mixed-precision fp32 or bf16, got '{}'.", o.mixed_precision);
  TITAN_CHECK_VALUE(o.float8 == "none" || titan::parse_choice<titan::Float8Recipe>(o.float8).has_value(),
                    "[bench_step_throughput] expected --float8 none|{}, got '{}'.",
                    titan::choice_list<titan::Float8Recipe>(), o.float8);
  TITAN_CHECK_VALUE(titan::parse_choice<titan::ReshardAfterForward>(o.reshard_after_forward).has_value(),
                    "[bench_step_throughput] expected --reshard-after-forward {}, got '{}'.",
                    titan::choice_list<titan::ReshardAfterForward>(), o.reshard_after_forward);
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best-of-5 GEMM rate at n=2048 on the current threads, as the step runs its GEMMs in `dtype` (bf16 through
// nn::mm: widened where titan widens them): the practical peak of this CPU.
double measured_gemm_flops(at::ScalarType dtype) {
  const int64_t n = 2048;
  const at::Tensor a = at::randn({n, n}).to(dtype);  // (n, n)
  const at::Tensor b = at::randn({n, n}).to(dtype);  // (n, n)
  const at::NoGradGuard no_grad;
  double best = 1e30;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const at::Tensor c = titan::nn::mm(a, b);  // (n, n)
    if (i > 0) best = std::min(best, seconds_since(t0));
  }
  return 2.0 * n * n * n / best;
}

// Rank 0's tokens in one number, to check every side trains on the same batch (the peers compute it alike).
int64_t data_checksum(const at::Tensor& input, const at::Tensor& labels) {
  const at::Tensor weights = at::arange(1, input.numel() + 1, at::kLong);
  return (input.cpu().reshape(-1) * weights).sum().item<int64_t>() +
         3 * (labels.cpu().reshape(-1) * weights).sum().item<int64_t>();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace titan;
  try {
    const Options o = parse(argc, argv);
    if (o.threads > 0) at::set_num_threads(static_cast<int>(o.threads));
    // Every CPU allocation of this thread is booked from here on: the step's allocator peak below.
    MemoryTracker tracker;
    const TrackMemory track(tracker);
    const dist::LaunchEnv env = dist::read_launch_env();
    const bool rank0 = env.rank == 0;
    const at::Device device = o.device == "cuda" ? at::Device(at::kCUDA, static_cast<int>(env.local_rank)) : at::kCPU;
    // FSDP over all ranks, as the peer's fully_shard over a one-axis mesh of WORLD_SIZE.
    const auto mesh = std::make_unique<dist::Mesh>(
        dist::Mesh::from_launch_env({.dp_shard = env.world_size}, {.backend = device.is_cuda() ? "nccl" : "gloo"}));

    llama3::Llama3Args args = llama3::flavor(o.flavor);
    if (o.n_layers > 0) args.n_layers = o.n_layers;
    if (o.tie_embeddings >= 0) args.tie_word_embeddings = o.tie_embeddings != 0;
    nn::manual_init_seed(0);
    at::manual_seed(static_cast<uint64_t>(env.rank));  // each rank draws its own batch
    llama3::Llama3 model(args, o.seq_len, at::TensorOptions().device(device));
    int64_t float8_converted = 0;
    if (o.float8 != "none") {  // before sharding, as torchtitan converts first; the output head stays high precision
      const Float8Recipe recipe = *parse_choice<Float8Recipe>(o.float8);
      Float8Config f8;
      f8.recipe_name = recipe;
      f8.filter_fqns = {"output"};
      float8_converted =
          static_cast<int64_t>(float8::convert_to_float8(model, float8::converter_options(f8)).converted.size());
    }
    const bool bf16 = o.mixed_precision == "bf16";
    // No-op on one rank.
    parallel::ParallelPlan plan = parallel::plan(model.sharding_spec(), {}, mesh->shape());
    plan.data_parallel.options.collectives = o.collectives_choice;
    plan.data_parallel.options.reshard_after_forward = *parse_choice<ReshardAfterForward>(o.reshard_after_forward);
    plan.data_parallel.options.overlap = o.overlap != 0;
    // FSDP's mixed precision (FSDP2's MixedPrecisionPolicy): bf16 gathered parameters and compute, fp32 reduce.
    if (bf16 && env.world_size > 1) plan.data_parallel.options.param_dtype = at::kBFloat16;
    // Without FSDP, autocast (torchtitan's maybe_enable_amp); the CUDA path has always used it.
    const bool autocast = device.is_cuda() || (bf16 && env.world_size == 1);
    const Parallelized parallel = parallelize(model, *mesh, plan);
    // One bf16 GEMM form on every rank, rank 0's, as the trainer does.
    if (bf16 && !device.is_cuda()) (void)titan::nn::use_rank0_bf16_gemm(mesh->group("world"));
    model.init_weights();
    // Counted on an unsharded meta twin: under FSDP `model` holds only this rank's shards.
    const llama3::Llama3 whole(args, o.seq_len, at::TensorOptions().device(at::kMeta));
    const auto params = model.unique_parameters();
    AdamW optimizer(params, {});  // torchtitan's defaults: betas (0.9, 0.95), eps 1e-8, wd 0.1, fused
    const auto forward = [&](const at::Tensor& t, const titan::nn::AttentionContext& c) { return model.forward(t, c); };
    const at::Tensor input = at::randint(0, args.vocab_size, {o.batch, o.seq_len}, at::kLong).to(device);   // (B, S)
    const at::Tensor labels = at::randint(0, args.vocab_size, {o.batch, o.seq_len}, at::kLong).to(device);  // (B, S)
    const int64_t global_tokens = o.batch * o.seq_len * env.world_size;

    std::vector<double> times;
    std::vector<double> losses;
    const auto step = [&] {
      optimizer.zero_grad();
      const ForwardBackwardResult fb = forward_backward(forward, {{input, labels}}, device, global_tokens, autocast);
      clip_grad_norm_(params, 1.0, mesh.get());
      optimizer.step(1e-4);
      // NOTE: the step is asynchronous on CUDA; reading one element waits for the optimizer's kernels.
      if (device.is_cuda()) (void)params.front().reshape(-1)[0].item<float>();
      return fb.loss;
    };
    for (int64_t s = 0; s < o.warmup + o.steps; ++s) {
      if (s == o.warmup) {
        reset_peak_memory(device);
        mesh->group("dp_shard").reset_stats();
      }
      const auto t0 = std::chrono::steady_clock::now();
      const double loss = step();
      if (s >= o.warmup) times.push_back(seconds_since(t0));
      losses.push_back(loss);
    }
    const MemoryStats memory = memory_stats(device);
    // Time this rank sat in Work::wait per step: the communication FSDP did not hide behind compute.
    const double comm_wait = mesh->group("dp_shard").stats().wait_seconds / static_cast<double>(o.steps);
    // Training state as the allocator holds it: this rank's parameters (shards), gradients, AdamW state.
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : params) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
    const int64_t state_bytes = storage_bytes(params) + storage_bytes(grads) + optimizer.state_bytes();
    // One more (untimed) step with the allocator's peak restarted: the most CPU bytes live at once in a step,
    // counted from the state above (gathered units, activations, gradients, communication buffers).
    int64_t step_peak_bytes = 0;
    if (!device.is_cuda()) {
      tracker.reset_peaks();
      step();
      step_peak_bytes = tracker.peak_total();
    }
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    const double tokens = static_cast<double>(o.batch * o.seq_len);  // per rank: torchtitan's tps is per device
    const double flops_per_token = static_cast<double>(whole.num_flops_per_token(o.seq_len));
    // The peak of the dtype the GEMMs run in (float8's CPU GEMMs are fp32).
    const bool bf16_gemms = o.mixed_precision == "bf16" && (device.is_cuda() || o.float8 == "none");
    const auto peak =
        peak_flops(device, at::get_num_threads(), 0, bf16_gemms && titan::nn::bf16_gemms_at_bf16_rate(device));
    const double gemm = device.is_cuda() ? 0.0 : measured_gemm_flops(bf16_gemms ? at::kBFloat16 : at::kFloat);
    const double tps = tokens / median;
    const double achieved = flops_per_token * tps;
    // Every rank says how it ran its bf16 GEMMs: a rank that chose otherwise would hold the others back.
    if (bf16_gemms && !device.is_cuda()) fmt::print("titan: rank {}: {}\n", env.rank, titan::nn::describe_bf16_gemm());
    if (!rank0) return 0;
    fmt::print(
        "titan: flavor {} ({:.1f}M params, {} layers)  B={} S={}  ranks={}  threads={}  device={}  precision {}{}\n",
        o.flavor, static_cast<double>(whole.num_params()) / 1e6, args.n_layers, o.batch, o.seq_len, env.world_size,
        at::get_num_threads(), o.device, o.mixed_precision,
        o.float8 == "none" ? std::string() : fmt::format(" + float8 {} ({} Linears)", o.float8, float8_converted));
    fmt::print(
        "titan: step time min/median/max: {:.3f} / {:.3f} / {:.3f} s  tokens/s/rank: {:.0f}  loss {:.4f} -> {:.4f}\n",
        sorted.front(), median, sorted.back(), tps, losses.front(), losses.back());
    fmt::print("titan: TFLOPs: {:.4f}  MFU: {:.1f}% of declared peak ({:.0f} GFLOP/s)", achieved / 1e12,
               100 * achieved / peak.flops, peak.flops / 1e9);
    if (gemm > 0) fmt::print(", {:.1f}% of measured GEMM peak ({:.0f} GFLOP/s)", 100 * achieved / gemm, gemm / 1e9);
    fmt::print("  peak memory {:.2f} GiB  exposed comm {:.3f} s/step\n",
               static_cast<double>(memory.max_active) / (1 << 30), comm_wait);
    fmt::print("titan: training state {:.3f} GiB, step allocator peak {:.3f} GiB\n",
               static_cast<double>(state_bytes) / (1 << 30), static_cast<double>(step_peak_bytes) / (1 << 30));
    if (!o.json.empty()) {
      const nlohmann::json j = {{"side", "titan"},
                                {"flavor", o.flavor},
                                {"n_layers", args.n_layers},
                                {"params", whole.num_params()},
                                {"batch", o.batch},
                                {"seq_len", o.seq_len},
                                {"ranks", env.world_size},
                                {"threads", at::get_num_threads()},
                                {"device", o.device},
                                {"mixed_precision", o.mixed_precision},
                                {"float8", o.float8},
                                {"float8_converted", float8_converted},
                                {"reshard_after_forward", o.reshard_after_forward},
                                {"overlap", o.overlap != 0},
                                {"step_times", times},
                                {"step_time_min", sorted.front()},
                                {"step_time_median", median},
                                {"step_time_max", sorted.back()},
                                {"tps", tps},
                                {"losses", losses},
                                {"flops_per_token", flops_per_token},
                                {"tflops", achieved / 1e12},
                                {"mfu_declared", 100 * achieved / peak.flops},
                                {"mfu_gemm", gemm > 0 ? 100 * achieved / gemm : 0.0},
                                {"gemm_peak_flops", gemm},
                                {"peak_memory_bytes", memory.max_active},
                                {"state_bytes", state_bytes},
                                {"data_checksum", data_checksum(input, labels)},
                                {"step_peak_bytes", step_peak_bytes},
                                {"comm_wait_s", comm_wait}};
      std::FILE* f = std::fopen(o.json.c_str(), "w");
      TITAN_CHECK(f != nullptr, "[bench_step_throughput] expected a writable --json path, got '{}'.", o.json);
      fmt::print(f, "{}\n", j.dump(2));
      std::fclose(f);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_step_throughput: {}\n", error_message(e));
    return 1;
  }
}
