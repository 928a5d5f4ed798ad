// SPDX-License-Identifier: BSD-3-Clause
// The token cross-entropy's forward + backward on CPU: titan's fused kernel against its ATen twin (the
// logits upcast to fp32, log-softmax, summed nll), for fp32 and bf16 logits of (tokens, vocab). Median
// milliseconds of `iters` calls after one warm-up, and the bytes each keeps for backward. Run:
//   OMP_NUM_THREADS=2 build/bin/bench_cross_entropy --tokens 1024 --vocab 32768 --iters 10
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include "bench_flags.hpp"
#include "bench_timing.hpp"
#include "titan/nn/loss.hpp"

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
    // Each pass differentiates a fresh leaf, so the gradient is written anew, never accumulated.
    const auto pass = [&](auto loss_fn) {
      return [&, loss_fn] { loss_fn(logits.detach().requires_grad_(), labels).backward(); };
    };
    const double twin = 1e3 * titan::bench::median_seconds(iters, pass(titan::cross_entropy_sum_reference));
    const double fused = 1e3 * titan::bench::median_seconds(iters, pass(titan::cross_entropy_sum));
    const double mib = static_cast<double>(tokens * vocab) / (1 << 20);
    // The twin keeps log_softmax's fp32 output; the kernel the logits and two floats per token.
    fmt::print("| {} | {:.1f} | {:.1f} | {:.2f} | {:.0f} MiB | {:.0f} MiB |\n", c10::toString(dtype), twin, fused,
               twin / fused, 4 * mib, static_cast<double>(logits.element_size()) * mib + 8.0 * tokens / (1 << 20));
  }
  return 0;
}
