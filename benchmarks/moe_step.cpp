// SPDX-License-Identifier: BSD-3-Clause
// MoE benchmark: training steps (forward, backward, gradient sums, clipping, expert-bias update, AdamW)
// of an MoE flavor (DeepSeek-V3 debugmodel by default, or Qwen3 debugmodel_moe) in fp32 on CPU at
// expert-parallel degrees 1, 2, 4. Ranks are threads of one process over Gloo (loopback), one
// intra-op thread each unless --threads says otherwise. EP borrows its ranks from dp_shard: ep N = N
// ranks, each with its share B/N of the global batch B and E/N of each layer's routed experts; the
// replicated parameters' gradients are summed by one flat all-reduce over the N ranks (DDP-like),
// the experts' need no sum (each expert lives on one rank: efsdp = 1).
//
// Per degree it prints tokens/s (global and per rank), the median step time, the time inside the
// token all-to-alls (dispatch and combine, forward and backward, timed by ExpertParallel's hook) and
// their share of the step, and the bytes this rank sent in them next to the uniform-routing formula
//   bytes/step/rank = 2 (dispatch, combine) x 2 (forward, backward) x L_moe x T_rank x K x (ep-1)/ep x D x 4 B
// (T_rank tokens per rank, K experts per token, D model width, L_moe MoE layers), and the time those
// measured bytes would take at the Gloo all-to-all bandwidth measured just before (an even all-to-all
// of one dispatch's size). On a 2-core machine ranks share the cores: the numbers show overhead, not
// scaling. Same initial weights (init seed 0) and the same global batch (at::manual_seed(0)) at every
// degree; benchmarks/peers/moe_peer.py is torchtitan's side at ep 1 (benchmarks/run_moe.sh runs both).
//   build/bin/bench_moe --model deepseek_v3 --flavor debugmodel --ep 1,2,4 --seq-len 256 --batch 8
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "bench_flags.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/deepseek_v3/args.hpp"
#include "titan/models/deepseek_v3/model.hpp"
#include "titan/models/qwen3/args.hpp"
#include "titan/models/qwen3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/parallel/expert_parallel.hpp"
#include "titan/train/step.hpp"

namespace {

struct Options {
  std::string model = "deepseek_v3";  ///< deepseek_v3 or qwen3
  std::string flavor;                 ///< the model's flavor; empty: debugmodel (deepseek_v3), debugmodel_moe (qwen3)
  std::vector<int64_t> ep{1, 2, 4};   ///< expert-parallel degrees to run (ranks = ep)
  int64_t seq_len = 256;              ///< tokens per sequence S
  int64_t batch = 8;                  ///< global sequences per step B, split over the ranks
  int64_t steps = 3;                  ///< timed steps
  int64_t warmup = 1;                 ///< untimed steps before them
  int64_t threads = 1;                ///< intra-op threads per rank
  int64_t grouped_mm = 1;             ///< routed experts through at::_grouped_mm (1) or the per-expert loop (0)
  std::string json;                   ///< write the results here when not empty
};

Options parse(int argc, char** argv) {
  Options o;
  titan::bench::parse_flags(argc, argv, "bench_moe",
                            {{"--model", &o.model},
                             {"--flavor", &o.flavor},
                             {"--ep", &o.ep},
                             {"--seq-len", &o.seq_len},
                             {"--batch", &o.batch},
                             {"--steps", &o.steps},
                             {"--warmup", &o.warmup},
                             {"--threads", &o.threads},
                             {"--grouped-mm", &o.grouped_mm},
                             {"--json", &o.json}});
  TITAN_CHECK_VALUE(o.model == "deepseek_v3" || o.model == "qwen3",
                    "[bench_moe] expected --model deepseek_v3 or qwen3, got '{}'.", o.model);
  if (o.flavor.empty()) o.flavor = o.model == "qwen3" ? "debugmodel_moe" : "debugmodel";
  TITAN_CHECK_VALUE(o.steps > 0 && o.threads > 0, "[bench_moe] expected --steps and --threads > 0, got {} and {}.",
                    o.steps, o.threads);
  for (int64_t ep : o.ep) {
    TITAN_CHECK_VALUE(ep >= 1 && o.batch % ep == 0,
                      "[bench_moe] expected every --ep to divide --batch {} (each rank takes B/ep sequences), got {}.",
                      o.batch, ep);
  }
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The few numbers of a flavor the benchmark needs, whichever model it is.
struct Shape {
  int64_t dim = 0;         // D
  int64_t vocab = 0;       // V
  int64_t top_k = 0;       // K
  int64_t experts = 0;     // E
  int64_t moe_layers = 0;  // L_moe
  int64_t params = 0;      // every expert counted
};

struct RankResult {
  std::vector<double> step_seconds;        // timed steps
  std::vector<double> all_to_all_seconds;  // per timed step: token exchanges
  std::vector<double> count_seconds;       // per timed step: the per-expert count exchanges
  std::vector<double> grad_sum_seconds;    // per timed step: the replicated parameters' gradient all-reduce
  std::vector<double> losses;              // global loss, every step (warmup included)
  int64_t bytes_per_step = 0;              // token all-to-all bytes this rank sent, per timed step
  int64_t exchanges_per_step = 0;          // token all-to-alls per timed step
  double all_to_all_bandwidth = 0;         // bytes/s of one even all-to-all of a dispatch's size (off-rank bytes)
};

// Bytes/s that one rank sends to the others in an even all-to-all of rows x dim fp32 (median of 5).
double measure_all_to_all_bandwidth(const titan::dist::ProcessGroup& group, int64_t rows, int64_t dim) {
  const int64_t n = group.size();
  const int64_t padded = (rows + n - 1) / n * n;   // even splits
  const at::Tensor in = at::randn({padded, dim});  // (R, D)
  at::Tensor out = at::empty_like(in);             // (R, D)
  std::vector<double> times;
  for (int i = 0; i < 6; ++i) {
    group.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    group.all_to_all(out, in).wait();
    if (i > 0) times.push_back(seconds_since(t0));
  }
  const double off_rank_bytes = static_cast<double>(in.nbytes()) * static_cast<double>(n - 1) / static_cast<double>(n);
  return off_rank_bytes / median(times);
}

template <class Model, class Args>
RankResult run_rank(const Options& o, const Args& args, const titan::dist::Mesh& mesh, const at::Tensor& input,
                    const at::Tensor& labels) {
  using namespace titan;
  at::manual_seed(0);
  nn::manual_init_seed(0);
  Model model(args, o.seq_len, at::TensorOptions());
  model.init_weights();  // the whole model on every rank: the same weights at every degree
  const parallel::ExpertParallel ep =
      parallel::apply_expert_parallel(model, mesh, {.moe_modules = parallel::moe_modules(model)});
  std::vector<at::Tensor> experts = ep.expert_parameters();
  auto is_expert = [&](const at::Tensor& p) {
    return std::any_of(experts.begin(), experts.end(), [&](const at::Tensor& e) { return e.is_same(p); });
  };
  const std::vector<at::Tensor> params = model.unique_parameters();
  std::vector<at::Tensor> replicated;
  for (const at::Tensor& p : params) {
    if (!is_expert(p)) replicated.push_back(p);
  }
  AdamW optimizer(params, {});  // torchtitan's defaults: betas (0.9, 0.95), eps 1e-8, weight decay 0.1
  const dist::ProcessGroup& dp = mesh.group("dp_cp");
  const dist::ProcessGroup& ep_group = mesh.group("ep");
  const int64_t rows = o.batch / mesh.size("dp");
  const int64_t first = mesh.coordinate("dp") * rows;
  const at::Tensor my_input = input.narrow(0, first, rows);    // (B/ep, S)
  const at::Tensor my_labels = labels.narrow(0, first, rows);  // (B/ep, S)
  const int64_t global_tokens = o.batch * o.seq_len;
  const auto forward = [&](const at::Tensor& t, const titan::nn::AttentionContext& c) { return model.forward(t, c); };

  RankResult result;
  if (ep_group.size() > 1) {
    result.all_to_all_bandwidth = measure_all_to_all_bandwidth(ep_group, rows * o.seq_len * args.moe.top_k, args.dim);
  }
  double grad_sum = 0;
  const auto step = [&] {
    optimizer.zero_grad();
    const ForwardBackwardResult fb =
        forward_backward(forward, {{.input = my_input, .labels = my_labels}}, at::kCPU, global_tokens);
    const auto t0 = std::chrono::steady_clock::now();
    if (dp.size() > 1) {  // the replicated parameters' gradients: one flat SUM (the loss is over global tokens)
      std::vector<at::Tensor> grads;
      for (const at::Tensor& p : replicated) grads.push_back(p.grad().reshape(-1));
      at::Tensor flat = at::cat(grads);  // (sum of numels)
      dp.all_reduce(flat).wait();
      int64_t offset = 0;
      for (const at::Tensor& p : replicated) {
        p.mutable_grad().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
        offset += p.numel();
      }
    }
    grad_sum = seconds_since(t0);
    ep.reduce_expert_gradients();  // efsdp = 1 here: nothing to sum
    // Global-norm clipping at 1.0: the replicated gradients' squares once, the experts' summed over ep.
    at::Tensor expert_sq = at::zeros({}, at::kFloat);      // ()
    at::Tensor replicated_sq = at::zeros({}, at::kFloat);  // ()
    for (const at::Tensor& p : params) (is_expert(p) ? expert_sq : replicated_sq).add_(p.grad().pow(2).sum());
    if (ep_group.size() > 1) ep_group.all_reduce(expert_sq).wait();
    const double norm = std::sqrt((expert_sq + replicated_sq).item<double>());
    const double scale = std::min(1.0, 1.0 / (norm + 1e-6));
    if (scale < 1.0) {
      for (const at::Tensor& p : params) p.mutable_grad().mul_(scale);
    }
    ep.update_expert_bias();
    optimizer.step(1e-4);
    return fb.loss;
  };
  for (int64_t s = 0; s < o.warmup + o.steps; ++s) {
    const bool timed = s >= o.warmup;
    ep.time_all_to_alls(timed);
    ep.reset_all_to_all_stats();
    if (ep_group.size() > 1) ep_group.barrier();  // every rank starts the step together
    const auto t0 = std::chrono::steady_clock::now();
    const double loss = step();
    const double seconds = seconds_since(t0);
    const parallel::AllToAllStats a2a = ep.all_to_all_stats();
    at::Tensor total = at::full({}, loss, at::kDouble);  // ()
    if (dp.size() > 1) dp.all_reduce(total).wait();
    result.losses.push_back(total.item<double>());
    if (!timed) continue;
    result.step_seconds.push_back(seconds);
    result.all_to_all_seconds.push_back(a2a.seconds);
    result.count_seconds.push_back(a2a.count_seconds);
    result.grad_sum_seconds.push_back(grad_sum);
    result.bytes_per_step = a2a.bytes_sent;  // the same every timed step: same batch, and the routing barely moves
    result.exchanges_per_step = a2a.exchanges;
  }
  return result;
}

template <class Model, class Args>
Shape shape_of(const Args& args, int64_t seq_len) {
  const Model meta(args, seq_len, at::TensorOptions().device(at::kMeta));
  return {.dim = args.dim,
          .vocab = args.vocab_size,
          .top_k = args.moe.top_k,
          .experts = args.moe.num_experts,
          .moe_layers = static_cast<int64_t>(titan::parallel::moe_modules(meta).size()),
          .params = meta.num_params()};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace titan;
  try {
    const Options o = parse(argc, argv);
    at::set_num_threads(static_cast<int>(o.threads));
    const bool deepseek = o.model == "deepseek_v3";
    deepseek_v3::DeepSeekV3Args ds_args;
    qwen3::Qwen3Args qw_args;
    if (deepseek) {
      ds_args = deepseek_v3::flavor(o.flavor);
      ds_args.moe.use_grouped_mm = o.grouped_mm != 0;
    } else {
      qw_args = qwen3::flavor(o.flavor);
      qw_args.moe.use_grouped_mm = o.grouped_mm != 0;
    }
    const Shape shape =
        deepseek ? shape_of<deepseek_v3::DeepSeekV3>(ds_args, o.seq_len) : shape_of<qwen3::Qwen3>(qw_args, o.seq_len);
    // The global batch, drawn as benchmarks/peers/moe_peer.py draws it (torch.manual_seed(0); two randint).
    at::manual_seed(0);
    const at::Tensor input = at::randint(0, shape.vocab, {o.batch, o.seq_len}, at::kLong);   // (B, S)
    const at::Tensor labels = at::randint(0, shape.vocab, {o.batch, o.seq_len}, at::kLong);  // (B, S)
    const at::Tensor weights = at::arange(1, input.numel() + 1, at::kLong);                  // (B*S)
    const int64_t checksum =
        (input.reshape(-1) * weights).sum().item<int64_t>() + 3 * (labels.reshape(-1) * weights).sum().item<int64_t>();

    fmt::print(
        "titan MoE: {} {} ({:.2f}M params, {} MoE layers, E={} K={} D={})  global B={} S={}  fp32 CPU  {} warmup + {} "
        "timed steps  {} intra-op thread(s)/rank  experts: {}  ranks as threads, Gloo\n",
        o.model, o.flavor, static_cast<double>(shape.params) / 1e6, shape.moe_layers, shape.experts, shape.top_k,
        shape.dim, o.batch, o.seq_len, o.warmup, o.steps, o.threads, o.grouped_mm != 0 ? "grouped_mm" : "loop");
    fmt::print("{:>3} {:>11} {:>10} {:>9} {:>10} {:>7} {:>9} {:>9} {:>10} {:>10} {:>6} {:>9} {:>10} {:>15}\n", "ep",
               "tok/s glob", "tok/s/rank", "step(med)", "a2a s/step", "a2a %", "counts s", "grad AR s", "a2a MB/st",
               "formula MB", "meas/f", "Gloo MB/s", "bytes/bw s", "loss 1st->last");
    nlohmann::json runs = nlohmann::json::array();
    for (int64_t n : o.ep) {
      std::vector<RankResult> results(static_cast<size_t>(n));
      std::mutex mutex;
      dist::run_local_ranks(n, [&](int64_t rank, const dist::Store& store) {
        const dist::Mesh mesh = n == 1 ? dist::Mesh() : dist::Mesh({.dp_shard = n, .ep = n}, rank, store);
        RankResult r = deepseek ? run_rank<deepseek_v3::DeepSeekV3>(o, ds_args, mesh, input, labels)
                                : run_rank<qwen3::Qwen3>(o, qw_args, mesh, input, labels);
        std::lock_guard lock(mutex);
        results[static_cast<size_t>(rank)] = std::move(r);
      });
      // The step ends on every rank together (the gradient all-reduce): rank 0's times stand for all;
      // the all-to-all figures are averaged over the ranks.
      const RankResult& r0 = results[0];
      const double step = median(r0.step_seconds);
      const double global_tokens = static_cast<double>(o.batch * o.seq_len);
      double a2a = 0, counts = 0, bytes = 0, bandwidth = 0;
      for (const RankResult& r : results) {
        a2a += median(r.all_to_all_seconds) / static_cast<double>(n);
        counts += median(r.count_seconds) / static_cast<double>(n);
        bytes += static_cast<double>(r.bytes_per_step) / static_cast<double>(n);
        bandwidth += r.all_to_all_bandwidth / static_cast<double>(n);
      }
      const double grad_sum = median(r0.grad_sum_seconds);
      const double tokens_per_rank = global_tokens / static_cast<double>(n);
      const double formula = 2.0 * 2.0 * static_cast<double>(shape.moe_layers) * tokens_per_rank *
                             static_cast<double>(shape.top_k) * static_cast<double>(n - 1) / static_cast<double>(n) *
                             static_cast<double>(shape.dim) * 4.0;
      const double predicted = bandwidth > 0 ? bytes / bandwidth : 0.0;
      const double mb = 1e6;
      fmt::print(
          "{:>3} {:>11.0f} {:>10.0f} {:>8.3f}s {:>10.4f} {:>6.1f}% {:>9.4f} {:>9.4f} {:>10.2f} {:>10.2f} {:>6.3f} "
          "{:>9.0f} {:>10.4f} {:>7.4f}->{:.4f}\n",
          n, global_tokens / step, tokens_per_rank / step, step, a2a, 100 * a2a / step, counts, grad_sum, bytes / mb,
          formula / mb, formula > 0 ? bytes / formula : 0.0, bandwidth / mb, predicted, r0.losses.front(),
          r0.losses.back());
      runs.push_back({{"ep", n},
                      {"ranks", n},
                      {"step_times", r0.step_seconds},
                      {"step_time_median", step},
                      {"tps_global", global_tokens / step},
                      {"tps_rank", tokens_per_rank / step},
                      {"all_to_all_s", a2a},
                      {"all_to_all_share", a2a / step},
                      {"count_exchange_s", counts},
                      {"grad_all_reduce_s", grad_sum},
                      {"all_to_all_bytes", bytes},
                      {"all_to_all_exchanges", r0.exchanges_per_step},
                      {"formula_bytes", formula},
                      {"gloo_all_to_all_bytes_per_s", bandwidth},
                      {"bytes_over_bandwidth_s", predicted},
                      {"losses", r0.losses}});
    }
    if (!o.json.empty()) {
      const nlohmann::json j = {{"side", "titan"},
                                {"model", o.model},
                                {"flavor", o.flavor},
                                {"params", shape.params},
                                {"moe_layers", shape.moe_layers},
                                {"experts", shape.experts},
                                {"top_k", shape.top_k},
                                {"dim", shape.dim},
                                {"vocab", shape.vocab},
                                {"batch", o.batch},
                                {"seq_len", o.seq_len},
                                {"threads", o.threads},
                                {"grouped_mm", o.grouped_mm != 0},
                                {"data_checksum", checksum},
                                {"runs", runs}};
      std::FILE* f = std::fopen(o.json.c_str(), "w");
      TITAN_CHECK(f != nullptr, "[bench_moe] expected a writable --json path, got '{}'.", o.json);
      fmt::print(f, "{}\n", j.dump(2));
      std::fclose(f);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_moe: {}\n", error_message(e));
    return 1;
  }
}
