// SPDX-License-Identifier: BSD-3-Clause
// Step-throughput benchmark: full training steps (forward, backward, clipping, fused AdamW) of a Llama 3
// flavor on one device; prints tokens/s, TFLOPs and MFU (torchtitan's 6N + 12*L*D*S formula) against
// the declared peak and against a measured fp32 GEMM peak of the same threads. Run:
//   build/bin/bench_step_throughput --flavor debugmodel --seq-len 512 --batch 8 --steps 10
//   build/bin/bench_step_throughput --flavor 100M --seq-len 512 --batch 4 --steps 5
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "titan/core/error.hpp"
#include "titan/metrics/metrics.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/optim/clip.hpp"
#include "titan/train/step.hpp"

namespace {

struct Options {
  std::string flavor = "debugmodel";
  int64_t seq_len = 512;
  int64_t batch = 8;
  int64_t steps = 10;
  int64_t warmup = 2;
  int64_t threads = 0;
  std::string json;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--flavor") o.flavor = v;
    else if (k == "--seq-len") o.seq_len = std::stoll(v);
    else if (k == "--batch") o.batch = std::stoll(v);
    else if (k == "--steps") o.steps = std::stoll(v);
    else if (k == "--warmup") o.warmup = std::stoll(v);
    else if (k == "--threads") o.threads = std::stoll(v);
    else if (k == "--json") o.json = v;
    else TITAN_CHECK_VALUE(false, "[bench_step_throughput] expected --flavor|--seq-len|--batch|--steps|--warmup|"
                                  "--threads|--json, got '{}'.", k);
  }
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best-of-5 fp32 GEMM rate at n=2048 on the current threads: the practical peak of this CPU.
double measured_gemm_flops() {
  const int64_t n = 2048;
  const at::Tensor a = at::randn({n, n});
  const at::Tensor b = at::randn({n, n});
  at::Tensor c = at::mm(a, b);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * n * n * n / best;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (o.threads > 0) at::set_num_threads(static_cast<int>(o.threads));
    at::manual_seed(0);
    titan::llama3::Llama3 model(titan::llama3::flavor(o.flavor), o.seq_len, at::TensorOptions());
    model.init_weights();
    const auto params = model.unique_parameters();
    titan::AdamW optimizer(params, {});
    const auto forward = [&](const at::Tensor& t) { return model.forward(t); };
    const int64_t vocab = model.vocab_size();
    const at::Tensor input = at::randint(0, vocab, {o.batch, o.seq_len}, at::kLong);   // (B, S)
    const at::Tensor labels = at::randint(0, vocab, {o.batch, o.seq_len}, at::kLong);  // (B, S)

    std::vector<double> times;
    for (int64_t s = 0; s < o.warmup + o.steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      optimizer.zero_grad();
      titan::forward_backward(forward, {{input, labels}}, at::kCPU);
      titan::clip_grad_norm_(params, 1.0);
      optimizer.step(1e-4);
      if (s >= o.warmup) times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double tokens = static_cast<double>(o.batch * o.seq_len);
    const double flops_per_token = static_cast<double>(model.num_flops_per_token(o.seq_len));
    const auto peak = titan::peak_flops(at::kCPU, at::get_num_threads());
    const double gemm = measured_gemm_flops();
    const double tps = tokens / median;
    const double achieved = flops_per_token * tps;
    fmt::print("flavor {} ({:.1f}M params)  B={} S={}  threads={}\n", o.flavor, model.num_params() / 1e6, o.batch,
               o.seq_len, at::get_num_threads());
    fmt::print("step time min/median/max: {:.3f} / {:.3f} / {:.3f} s\n", times.front(), median, times.back());
    fmt::print("tokens/s: {:.0f}  TFLOPs: {:.4f}  MFU: {:.1f}% of declared peak ({:.0f} GFLOP/s), {:.1f}% of "
               "measured GEMM peak ({:.0f} GFLOP/s)\n",
               tps, achieved / 1e12, 100 * achieved / peak.flops, peak.flops / 1e9, 100 * achieved / gemm, gemm / 1e9);
    if (!o.json.empty()) {
      const nlohmann::json j = {{"flavor", o.flavor}, {"batch", o.batch}, {"seq_len", o.seq_len},
                                {"threads", at::get_num_threads()}, {"step_time_min", times.front()},
                                {"step_time_median", median}, {"step_time_max", times.back()}, {"tps", tps},
                                {"tflops", achieved / 1e12}, {"mfu_declared", 100 * achieved / peak.flops},
                                {"mfu_gemm", 100 * achieved / gemm}, {"gemm_peak_flops", gemm}};
      std::FILE* f = std::fopen(o.json.c_str(), "w");
      TITAN_CHECK(f != nullptr, "[bench_step_throughput] expected a writable --json path, got '{}'.", o.json);
      fmt::print(f, "{}\n", j.dump(2));
      std::fclose(f);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", titan::error_message(e));
    return 1;
  }
}
