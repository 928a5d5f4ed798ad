// SPDX-License-Identifier: BSD-3-Clause
// The token cross-entropy's forward + backward on CPU: titan's fused kernel against its ATen twin (the
// logits upcast to fp32, log-softmax, summed nll), for fp32 and bf16 logits of (tokens, vocab). Median
// milliseconds of `iters` calls after one warm-up, and the bytes each keeps for backward. Run:
//   OMP_NUM_THREADS=2 build/bin/bench_cross_entropy --tokens 1024 --vocab 32768 --iters 10
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench_flags.hpp"
#include "titan/nn/loss.hpp"

namespace {

using Clock = std::chrono::steady_clock;

/// Median milliseconds of `iters` forward + backward passes of `loss_fn` after one warm-up.
template <class LossFn>
double median_ms(const at::Tensor& logits, const at::Tensor& labels, int64_t iters, LossFn&& loss_fn) {
  std::vector<double> times;
  for (int64_t i = 0; i <= iters; ++i) {
    const at::Tensor leaf = logits.detach().requires_grad_();  // (1, N, V)
    const auto start = Clock::now();
    loss_fn(leaf, labels).backward();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (i > 0) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 1024;
  int64_t vocab = 32768;
  int64_t iters = 10;
  titan::bench::parse_flags(argc, argv, "bench_cross_entropy",
                            {{"--tokens", &tokens}, {"--vocab", &vocab}, {"--iters", &iters}});
  fmt::print("cross-entropy forward + backward, ({}, {}) logits, {} threads, median of {}\n", tokens, vocab,
             at::get_num_threads(), iters);
  fmt::print(
      "| logits | ATen twin ms | fused ms | twin / fused | kept for backward: twin | fused |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: |\n");
  const at::Tensor labels = at::randint(vocab, {1, tokens}, at::kLong);  // (1, N)
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor logits = (at::randn({1, tokens, vocab}) * 3).to(dtype);  // (1, N, V)
    const double twin = median_ms(logits, labels, iters, titan::cross_entropy_sum_reference);
    const double fused = median_ms(logits, labels, iters, titan::cross_entropy_sum);
    const double mib = static_cast<double>(tokens * vocab) / (1 << 20);
    // The twin keeps log_softmax's fp32 output; the kernel the logits and two floats per token.
    fmt::print("| {} | {:.1f} | {:.1f} | {:.2f} | {:.0f} MiB | {:.0f} MiB |\n", c10::toString(dtype), twin, fused,
               twin / fused, 4 * mib, static_cast<double>(logits.element_size()) * mib + 8.0 * tokens / (1 << 20));
  }
  return 0;
}
