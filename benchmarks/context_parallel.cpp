// SPDX-License-Identifier: BSD-3-Clause
// Context-parallel attention benchmark: one Llama attention layer (projections, RoPE at the true
// positions, causal attention across the cp split), forward + backward on cp ranks as threads of one
// process (Gloo over loopback, one intra-op thread each), for each sequence length, cp degree and K/V
// exchange. Per row:
//   - kept: the bytes the forward leaves alive on a rank (its saved activations and output), booked per
//     rank by a wrapping CPU allocator (rank_memory.hpp); they should scale as S/cp;
//   - peak: the forward's transient peak above that (allgather holds every rank's K/V at once: grows
//     with S; the ring holds two ranks' at a time: S/cp);
//   - comm: the bytes a rank sent in the cp group during forward + backward (titan's CommStats: ring
//     volumes; Gloo's emulated reduce-scatter counts twice), beside the formula for the same exchange:
//       allgather: fwd all-gather of K,V + bwd all-gather again + bwd reduce-scatter of dK,dV (x2 on Gloo)
//                  = (cp-1) x kv x (1 + 1 + 2 x g)
//       ring:      fwd (cp-1) hops of K,V + bwd (cp-1) hops of K,V + cp hops of dK,dV
//                  = (cp-1) x kv x 2 + cp x kv x g
//       ulysses:   fwd all-to-all of q, K, V and of the output, bwd the same of their gradients, each rank
//                  keeping 1/cp of what it holds = (cp-1)/cp x (2 x q + kv) x (1 + g)
//     with q = B x H x S/cp x HD x bytes(dtype) (one rank's queries), kv = 2 x B x KVH x S/cp x HD x bytes(dtype) (one
//     rank's K and V) and g = 4 / bytes(dtype) (the gradients travel in fp32);
//   - the median forward + backward time (2 cores: ranks share them, so time is not the point here).
// Run:
//   build/bin/bench_context_parallel --seq 2048,4096 --cp 1,2,4 --rotate allgather,alltoall,ulysses
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "bench_flags.hpp"
#include "rank_memory.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/attention.hpp"
#include "titan/nn/attention_context.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/rope.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int64_t> seq{2048, 4096};  // sequence lengths
  std::vector<int64_t> cp{1, 2, 4};      // context-parallel degrees
  std::string rotate = "allgather,alltoall,ulysses";
  int64_t dim = 256;      // debugmodel's
  int64_t heads = 16;     // debugmodel's
  int64_t kv_heads = 16;  // debugmodel's (no GQA)
  int64_t batch = 1;
  int64_t iters = 3;
};

Options parse(int argc, char** argv) {
  Options o;
  titan::bench::parse_flags(argc, argv, "bench_context_parallel",
                            {{"--seq", &o.seq},
                             {"--cp", &o.cp},
                             {"--rotate", &o.rotate},
                             {"--dim", &o.dim},
                             {"--heads", &o.heads},
                             {"--kv-heads", &o.kv_heads},
                             {"--batch", &o.batch},
                             {"--iters", &o.iters}});
  return o;
}

struct RankResult {
  int64_t kept = 0;    // bytes alive after forward
  int64_t peak = 0;    // forward's transient peak above `kept`
  int64_t comm = 0;    // bytes sent in the cp group, forward + backward
  double seconds = 0;  // median forward + backward
};

RankResult run_rank(const Options& o, int64_t seq, int64_t cp, titan::CpRotateMethod rotate, int64_t rank,
                    const titan::dist::Store& store) {
  at::set_num_threads(1);
  titan::bench::RankMemory& memory = titan::bench::RankMemory::install();
  titan::bench::RankMemory::set_thread_rank(static_cast<int>(rank));
  const titan::dist::Mesh mesh({.cp = cp}, rank, store);
  titan::nn::manual_init_seed(1);
  titan::nn::Attention attention(o.dim, o.heads, o.kv_heads, at::TensorOptions());
  attention.init_weights(titan::nn::InitSite::current() / "attention", 0.02);
  attention.set_context_parallel_degree(cp);
  const titan::nn::RopeTables rope =
      titan::nn::make_rope_tables({.head_dim = o.dim / o.heads, .max_positions = seq}, at::kCPU);
  auto sharding = std::make_shared<titan::nn::SequenceSharding>(
      titan::nn::SequenceSharding{.group = std::make_shared<titan::dist::ProcessGroup>(mesh.group("cp")),
                                  .layout = {.seq_len = seq, .degree = cp, .rank = rank, .load_balance = true},
                                  .rotate = rotate});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor whole = at::randn({o.batch, seq, o.dim}, gen);  // (B, S, D)
  const at::Tensor x = sharding->layout.shard(whole, 1);           // (B, S/cp, D)
  const titan::nn::AttentionContext context{.positions = sharding->layout.token_index(at::kCPU),
                                            .sharding = cp > 1 ? sharding : nullptr};
  RankResult r;
  std::vector<double> times;
  for (int64_t i = 0; i < o.iters; ++i) {
    const at::Tensor input = x.clone().requires_grad_(true);
    mesh.group("cp").reset_stats();
    const auto start = Clock::now();
    at::Tensor y;  // (B, S/cp, D)
    int64_t kept = 0, peak = 0;
    {
      const int64_t before = memory.live(static_cast<int>(rank));
      memory.reset_peak(static_cast<int>(rank));
      y = attention.forward(input, rope, context);
      mesh.group("cp").barrier();  // every rank's exchange buffers released
      kept = memory.live(static_cast<int>(rank)) - before;
      peak = memory.peak(static_cast<int>(rank)) - before;
    }
    y.backward(at::ones_like(y));
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    r.kept = kept;
    r.peak = peak - kept;
    r.comm = mesh.group("cp").stats().total();
  }
  std::sort(times.begin(), times.end());
  r.seconds = times[times.size() / 2];
  return r;
}

double formula_bytes(const Options& o, int64_t seq, int64_t cp, titan::CpRotateMethod rotate) {
  if (cp == 1) return 0;
  const double kv = 2.0 * o.batch * o.kv_heads * (seq / cp) * (o.dim / o.heads) * 4.0;  // fp32 K and V
  const double g = 1.0;                                                                 // fp32 gradients
  if (rotate == titan::CpRotateMethod::ulysses) {
    int64_t f = 1;  // KV heads are repeated f times where cp does not divide them
    while ((o.kv_heads * f) % cp != 0 || (o.heads / o.kv_heads) % f != 0) ++f;
    const double q = 1.0 * o.batch * o.heads * (seq / cp) * (o.dim / o.heads) * 4.0;  // fp32 queries
    const double kv_sent = kv * static_cast<double>(f);
    return (cp - 1.0) / cp * (2 * q + kv_sent) * (1 + g);
  }
  return rotate == titan::CpRotateMethod::allgather ? (cp - 1) * kv * (1 + 1 + 2 * g) : (cp - 1) * kv * 2 + cp * kv * g;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    std::vector<titan::CpRotateMethod> rotations;
    std::stringstream ss(o.rotate);
    for (std::string item; std::getline(ss, item, ',');) {
      const auto parsed = titan::parse_choice<titan::CpRotateMethod>(item);
      TITAN_CHECK_VALUE(parsed.has_value(),
                        "[bench_context_parallel] expected --rotate allgather|alltoall|ulysses, got '{}'.", item);
      rotations.push_back(*parsed);
    }
    constexpr double kMiB = 1024.0 * 1024.0;
    fmt::print("attention layer dim {} heads {} kv_heads {} batch {}, fp32, cp ranks as threads (Gloo)\n", o.dim,
               o.heads, o.kv_heads, o.batch);
    fmt::print(
        "| S | cp | exchange | kept MiB/rank | kept x cp / kept(cp 1) | fwd peak above kept MiB | comm MiB/rank "
        "| formula MiB | fwd+bwd ms |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int64_t seq : o.seq) {
      double kept_one = 0;
      for (int64_t cp : o.cp) {
        for (auto rotate : rotations) {
          if (cp == 1 && rotate != rotations.front()) continue;  // nothing is exchanged
          std::vector<RankResult> results(static_cast<size_t>(cp));
          std::mutex mutex;
          titan::dist::run_local_ranks(cp, [&](int64_t rank, const titan::dist::Store& store) {
            RankResult r = run_rank(o, seq, cp, rotate, rank, store);
            std::lock_guard lock(mutex);
            results[static_cast<size_t>(rank)] = r;
          });
          const RankResult& r0 = results[0];
          int64_t kept = 0, peak = 0, comm = 0;
          for (const auto& r : results) {
            kept = std::max(kept, r.kept);
            peak = std::max(peak, r.peak);
            comm = std::max(comm, r.comm);
          }
          if (cp == 1) kept_one = static_cast<double>(kept);
          fmt::print("| {} | {} | {} | {:.2f} | {:.3f} | {:.2f} | {:.2f} | {:.2f} | {:.1f} |\n", seq, cp,
                     cp == 1 ? "-" : std::string(titan::choice_name(rotate)), kept / kMiB,
                     kept_one > 0 ? static_cast<double>(kept) * cp / kept_one : 0.0, peak / kMiB, comm / kMiB,
                     formula_bytes(o, seq, cp, rotate) / kMiB, r0.seconds * 1e3);
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
