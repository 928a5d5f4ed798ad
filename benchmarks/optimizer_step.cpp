// SPDX-License-Identifier: BSD-3-Clause
// The optimizer step alone, AdamW against Muon, on one Llama 3 flavor in fp32 on CPU (one process, gradients set
// once). AdamW: optimizer.implementation fused over every parameter. Muon: the 2-D hidden matrices through momentum,
// Newton-Schulz (5 bf16 iterations) and the update, AdamW over the embeddings, the head and the norms. Prints the
// median step of `iters` after one warm-up, Newton-Schulz's share (every matrix orthogonalised alone, timed the same
// way), and each optimizer's state bytes. Run:
//   OMP_NUM_THREADS=2 build/bin/bench_optimizer_step --flavor debugmodel --iters 10
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bench_flags.hpp"
#include "bench_timing.hpp"
#include "titan/models/llama3/args.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/optim/muon.hpp"
#include "titan/train/rank_model.hpp"

int main(int argc, char** argv) {
  std::string flavor = "debugmodel";
  int64_t iters = 10;
  titan::bench::parse_flags(argc, argv, "bench_optimizer_step", {{"--flavor", &flavor}, {"--iters", &iters}});
  const titan::llama3::Llama3Args args = titan::llama3::flavor(flavor);
  titan::llama3::Llama3 model(args, /*seq_len=*/128, at::TensorOptions());
  model.init_weights();
  const std::vector<at::Tensor> params = model.unique_parameters();
  const std::vector<std::string> names = titan::parameter_names(model, params);
  const std::vector<std::string> adamw_modules = titan::detail::embedding_and_head_modules(model.sharding_spec());
  int64_t numel = 0;
  for (const at::Tensor& p : params) {
    p.mutable_grad() = at::randn_like(p) * 1e-2;
    numel += p.numel();
  }
  fmt::print("optimizer step, Llama 3 {} ({:.1f}M parameters), fp32, {} threads, median of {}\n", flavor,
             static_cast<double>(numel) / 1e6, at::get_num_threads(), iters);
  fmt::print(
      "| optimizer | step ms | Newton-Schulz ms (GFLOP/s) | state MiB |\n"
      "| --- | ---: | ---: | ---: |\n");
  const auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };

  titan::AdamW adamw(params, {.lr = 1e-4}, names);
  const double adamw_ms = 1e3 * titan::bench::median_seconds(iters, [&] { adamw.step(1e-4); });
  fmt::print("| AdamW (fused) | {:.2f} | - | {:.1f} |\n", adamw_ms, mib(adamw.state_bytes()));

  titan::Muon muon(params, {.name = titan::OptimizerName::muon, .lr = 1e-4, .muon_lr = 1e-4}, names,
                   {.adamw_modules = adamw_modules});
  std::vector<at::Tensor> matrices;
  for (size_t i = 0; i < params.size(); ++i) {
    if (muon.is_matrix(i)) matrices.push_back(params[i].grad());
  }
  const titan::NewtonSchulz ns{};
  // Per iteration on X (m, n), m <= n: X X^T (2 m^2 n), b A + c A^2 (2 m^3), (..) X (2 m^2 n).
  double ns_flops = 0;
  for (const at::Tensor& g : matrices) {
    const auto m = static_cast<double>(std::min(g.size(0), g.size(1)));
    const auto n = static_cast<double>(std::max(g.size(0), g.size(1)));
    ns_flops += static_cast<double>(ns.steps) * (4 * m * m * n + 2 * m * m * m);
  }
  const double ns_ms = 1e3 * titan::bench::median_seconds(iters, [&] {
                         for (const at::Tensor& g : matrices) titan::newton_schulz(g, ns);
                       });
  const double muon_ms = 1e3 * titan::bench::median_seconds(iters, [&] { muon.step(1e-4); });
  fmt::print("| Muon ({} matrices) + AdamW (the rest) | {:.2f} | {:.2f} ({:.1f}) | {:.1f} |\n", matrices.size(),
             muon_ms, ns_ms, ns_flops / ns_ms / 1e6, mib(muon.state_bytes()));
  return 0;
}
