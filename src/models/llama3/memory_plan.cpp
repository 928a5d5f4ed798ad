// SPDX-License-Identifier: BSD-3-Clause
// The planner's arithmetic. Parameters, gradients and optimizer state are exact byte counts of the
// tensors titan keeps (TP shards, then FSDP's dim-0 shards padded to equal rows); activations follow
// what autograd keeps of each op titan's Llama 3 runs (one term per saved tensor, below), played over
// one microbatch's forward and backward to find its peak, and over the pipeline schedule's program
// for the microbatches in flight; communication is the gathered FSDP units in flight. On GPU the
// terms that make it predict torchtitan's published runs follow (allocator, NCCL, float8, compile,
// loss parallelism, pipelining buffers), and the step time adds up compute and unhidden communication.
#include "titan/models/llama3/memory_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/models/llama3/parallelize.hpp"
#include "titan/parallel/pipeline_schedule.hpp"

namespace titan::llama3 {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int64_t kMiB = 1024 * 1024;

// The terms below make the plan predict torchtitan's published H100 runs (benchmarks/
// llama3_h100_202412_torchtitan.md); docs/memory_planner.md compares every row. One set serves all rows.

// The published memory is torch.cuda.memory_stats' reserved_bytes.all.peak: the segments the caching
// allocator took from cudaMalloc, not the live tensors. Parameters, gradients and optimizer state are
// allocated once, each in a block of its own size (rounded to 2 MiB: under 0.1% here). The step's
// transient tensors (activations, gathered weights, collective buffers) are freed and allocated again
// in other sizes every microbatch; the allocator splits cached blocks for smaller requests and keeps
// them, so its segments outgrow the live bytes. One fraction for every job, fitted on the table's rows
// as a whole (docs/memory_planner.md).
constexpr double kTransientFragmentation = 0.16;
// A process's CUDA context, kernel images and libraries (cuBLAS, NCCL): about 600 MiB on an H100 with
// torch loaded, outside the allocator.
constexpr int64_t kCudaContext = 600 * kMiB;
// NCCL's own buffers per communicator, cudaMalloc'd by NCCL and so outside the allocator too: per
// channel a 4 MiB Simple, ~4.5 MiB LL128 and 256 KiB LL buffer for each of the ring's two peers, with
// 32 channels on NVLink.
constexpr int64_t kNcclPerCommunicator = 32 * 2 * (8 * kMiB + kMiB * 3 / 4);

// Compute efficiency (hardware FLOPs, recompute included, over peak) of an eager bf16 step, fitted on
// Table 1's eager row: 5,762 tokens/s x 57.9 GFLOP/token x 1.122 (op AC's recompute) / 989 TFLOP/s.
constexpr double kEagerEfficiency = 0.378;
// torch.compile of the blocks: Table 1's compiled row over its eager row (6,667 / 5,762 tokens/s).
constexpr double kCompileSpeedup = 1.157;
// Float8 linears (tensorwise): Table 1's compile + float8 row over the compiled one (8,532 / 6,667).
constexpr double kFloat8Speedup = 1.280;
// Context parallelism's compute efficiency by degree, from Table 2, where every rank holds 32k tokens
// whatever the degree: model FLOP/s 376 (CP 1), 376 (CP 2), 269 (CP 4), 251 (CP 8) TFLOP/s. The ring
// splits each attention into cp pieces with a log-sum-exp merge, and more pieces run less efficiently.
double cp_efficiency(int64_t cp) {
  if (cp <= 2) return 1.0;
  if (cp <= 4) return 269.0 / 376.0;
  return 251.0 / 376.0;
}

int64_t elem_bytes(DType d) { return d == DType::float32 ? 4 : 2; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One parameter as the plan shards it: TP splits dim 0 (colwise, vocab-parallel) or dim 1 (rowwise).
struct ParamShape {
  std::string name;
  std::string module;  // top-level module path: tok_embeddings, layers.N, norm, output
  int64_t rows = 0;    // dim 0
  int64_t row_numel = 1;
  int tp_dim = -1;  // -1: replicated over tp
};

std::vector<ParamShape> param_shapes(const Llama3& model) {
  std::vector<ParamShape> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const at::Tensor& p = item.value();
    ParamShape s;
    s.name = name;
    const size_t dot = name.find('.');
    s.module = name.substr(0, dot);
    if (s.module == "layers") s.module = name.substr(0, name.find('.', dot + 1));
    s.rows = p.dim() > 0 ? p.size(0) : 1;
    s.row_numel = p.dim() > 0 ? p.numel() / std::max<int64_t>(p.size(0), 1) : 1;
    for (const char* colwise :
         {"attention.wq.weight", "attention.wk.weight", "attention.wv.weight", "feed_forward.w1.weight",
          "feed_forward.w3.weight", "tok_embeddings.weight", "output.weight"}) {
      if (name.ends_with(colwise)) s.tp_dim = 0;
    }
    for (const char* rowwise : {"attention.wo.weight", "feed_forward.w2.weight"}) {
      if (name.ends_with(rowwise)) s.tp_dim = 1;
    }
    out.push_back(std::move(s));
  }
  return out;
}

// The AC policy of one block.
enum class BlockAc { none, full, op };

struct AcPolicy {
  std::string name = "none";
  AcMode mode = AcMode::none;
  int64_t every = 0;  // selective N
  bool op = false;
  BlockAc block(int64_t layer) const {
    if (mode == AcMode::none) return BlockAc::none;
    if (mode == AcMode::full) return BlockAc::full;
    if (op) return BlockAc::op;
    return (layer + 1) % every == 0 ? BlockAc::full : BlockAc::none;
  }
};

AcPolicy ac_policy(const ActivationCheckpointConfig& ac, const Llama3Args& args) {
  // The plan's own parser checks the mode and option (the same errors the trainer gives).
  (void)activation_checkpoint_plan(args, ac);
  AcPolicy p{.mode = ac.mode};
  if (ac.mode == AcMode::full) p.name = "full";
  if (ac.mode == AcMode::selective) {
    if (ac.selective_ac_option == "op") {
      p.op = true;
      p.name = "op";
    } else {
      p.every = std::stoll(ac.selective_ac_option);
      p.name = fmt::format("selective {}", p.every);
    }
  }
  return p;
}

// What the activation model needs of one layout.
struct Shapes {
  int64_t b = 1;               // sequences per microbatch
  int64_t s = 1;               // tokens per sequence on this rank (seq_len / cp)
  int64_t t = 1;               // tp
  int64_t cp = 1;              // cp
  int64_t a = 4;               // bytes per activation element (compute dtype)
  bool fused_norm = false;     // CUDA's fused RMSNorm (saves input + rstd); CPU's composite saves more
  bool fused_loss = false;     // CPU's fused cross-entropy (keeps the logits + two floats per token), not under TP
  bool compiled = false;       // torch.compile of the blocks: inductor fuses the SwiGLU's elementwise ops
  bool loss_parallel = false;  // GPU, TP > 1 and parallelism.disable_loss_parallel false
  int64_t D = 0, Dq = 0, Dkv = 0, F = 0, V = 0, H = 0;  // per tp rank: Dq, Dkv, F, V, H
  int64_t T() const { return b * s; }
  int64_t Tn() const { return t > 1 ? T() / t : T(); }  // tokens at the norms (sequence parallel)
};

// RMSNorm over (Tn, D): what it keeps. Its input is counted here (it is the block's input or the
// residual after attention). CPU's composite rms_norm keeps the normalized tensor in fp32 (and, for
// bf16 input, the fp32 copy too); CUDA's fused kernel keeps the input and rstd only.
int64_t norm_saved(const Shapes& x) {
  const int64_t n = x.Tn() * x.D;
  const int64_t extra = x.fused_norm ? 0 : n * (x.a == 4 ? 4 : 6);
  return n * x.a + x.Tn() * 4 + extra;
}

// Everything one block keeps for backward without checkpointing (titan's ops; see nn/attention.cpp):
// both norms, the norm outputs the projections read (all-gathered under TP), the rotated q/k and v,
// SDPA's output (already laid out (B, S, H, HD): wo's input is a view of it) and logsumexp, and the
// SwiGLU's w1 out, silu out, w3 out and their product. RoPE keeps only its (constant) table: the
// complex multiply's gradient needs the other factor alone. Checked against autograd's saved tensors
// of the same ops (docs/memory_planner.md).
int64_t block_full(const Shapes& x) {
  const int64_t T = x.T();
  int64_t bytes = 2 * norm_saved(x);              // attention_norm (block input), ffn_norm (residual h)
  bytes += 2 * T * x.D * x.a;                     // n1 and n2 as the projections read them
  bytes += T * (x.Dq + x.Dkv) * x.a;              // rotated q and k (SDPA keeps them)
  bytes += T * x.Dkv * x.a;                       // v
  bytes += T * x.Dq * x.a + x.b * x.H * x.s * 4;  // SDPA out + logsumexp
  bytes += 4 * T * x.F * x.a;                     // w1 out, silu out, w3 out, product
  // Compiled, silu(w1 out) and the product are recomputed inside the fused backward kernel from the
  // w1 and w3 outputs instead of being stored (inductor's min-cut partitioner saves the matmul outputs).
  if (x.compiled) bytes -= 2 * T * x.F * x.a;
  if (x.cp > 1) bytes += 2 * T * x.cp * x.Dkv * x.a;  // all-gathered K and V of the whole sequence
  return bytes;
}

// Per-operator checkpointing keeps the block input, every other matmul's output (wq, wv, w1, w2) and
// SDPA's output and logsumexp; the rest is recomputed.
int64_t block_op(const Shapes& x) {
  const int64_t T = x.T();
  const int64_t bytes =
      x.Tn() * x.D * x.a + T * (x.Dq + x.Dkv + x.F + x.D) * x.a + T * x.Dq * x.a + x.b * x.H * x.s * 4;
  // Eager SAC stores every output the policy marks; compiled, the partitioner keeps only what the
  // backward reads, and no backward reads w2's output (the residual add's gradient needs no input).
  return x.compiled ? bytes - T * x.D * x.a : bytes;
}

int64_t block_saved(const Shapes& x, BlockAc ac) {
  switch (ac) {
    case BlockAc::none:
      return block_full(x);
    case BlockAc::full:
      return x.Tn() * x.D * x.a;  // the input only
    case BlockAc::op:
      return block_op(x);
  }
  return 0;
}

// What a block's backward holds on top of the saved tensors: the gradient arriving at its output
// and the SwiGLU's gradients in flight (three of (T, F) at once).
int64_t block_backward_transient(const Shapes& x) { return x.Tn() * x.D * x.a + 3 * x.T() * x.F * x.a; }

// The head (final norm, output projection, loss): the norm, its output as the output projection reads
// it, and what the loss keeps: the fused CPU cross-entropy the logits in their dtype and each token's
// log-sum-exp, ATen's cross_entropy on fp32 logits log_softmax's fp32 output.
int64_t head_saved(const Shapes& x) {
  const int64_t loss = x.fused_loss ? x.T() * x.V * x.a + x.T() * 8 : x.T() * x.V * 4;
  return norm_saved(x) + x.T() * x.D * x.a + loss;
}

// What the loss adds at its worst moment on top of what the head keeps. Fused: the backward's one (T, V)
// gradient in the logits' dtype. ATen's: the logits and their fp32 copy while the loss is computed, then
// two (T, V) fp32 gradients in backward (of log_softmax's output and of its input).
int64_t loss_transient(const Shapes& x) {
  if (x.fused_loss) return x.T() * x.V * x.a;
  // GPU with loss parallelism as the published runs computed it (DTensor's loss_parallel: its
  // _log_softmax on the local vocab shard): while the result is formed, the bf16 logits (the train step
  // holds them until the loss returns), their fp32 copy, the shifted logits and their exponentials are
  // all alive. Its backward (exp(out) times the summed gradient, subtracted from the gradient) holds three.
  if (x.loss_parallel) return x.T() * x.V * (x.a + 3 * 4);
  const int64_t logits = x.T() * x.V * x.a + (x.a == 4 ? 0 : x.T() * x.V * 4);
  return std::max(logits, 2 * x.T() * x.V * 4);
}

struct RankModules {
  std::set<std::string> modules;
  std::vector<int64_t> stages;  // global stage indices on this rank
};

struct Context {
  const Llama3& model;
  const JobConfig& config;
  const PlanOptions& options;
  std::vector<ParamShape> params;
  std::vector<std::vector<std::string>> units;
  std::map<std::string, int64_t> unit_of;  // top-level module -> unit
};

struct Layout {
  dist::MeshShape mesh{};
  AcPolicy ac{};
  int64_t microbatch = 1;   // sequences per forward
  int64_t local_batch = 1;  // sequences per dp rank per accumulation step
  int64_t accumulation = 1;
};

std::vector<std::vector<std::string>> stages_of(const Context& c, int64_t pp) {
  if (pp == 1) return {};
  return pipeline_plan(c.model.args(), pp, c.config.parallelism).stages;
}

// Microbatches each stage holds at the worst moment of rank's program, weighted by bytes per stage:
// walks the program, +1 at a forward, -1 at the backward that frees the activations (B, or W for
// split backward since W still reads saved inputs).
double max_in_flight_bytes(const parallel::PipelineProgram& program, int64_t rank,
                           const std::map<int64_t, int64_t>& stage_bytes, int64_t* count) {
  using Op = parallel::PipelineAction::Op;
  bool split = false;
  for (const auto& a : program.actions[static_cast<size_t>(rank)]) split |= a.op == Op::kBackwardWeight;
  std::map<int64_t, int64_t> live;
  double best = 0;
  int64_t best_count = 0;
  for (const auto& a : program.actions[static_cast<size_t>(rank)]) {
    if (a.op == Op::kForward) ++live[a.stage];
    if ((a.op == Op::kBackward) || (split && a.op == Op::kBackwardWeight)) --live[a.stage];
    double bytes = 0;
    int64_t n = 0;
    for (const auto& [stage, k] : live) {
      bytes += static_cast<double>(k) * static_cast<double>(stage_bytes.at(stage));
      n += k;
    }
    if (bytes > best) {
      best = bytes;
      best_count = n;
    }
  }
  *count = best_count;
  return best;
}

MemoryPlan evaluate(const Context& c, const Layout& l) {
  const JobConfig& cfg = c.config;
  const Llama3Args& args = c.model.args();
  const dist::MeshShape& m = l.mesh;
  const bool gpu = c.options.gpu;
  const int64_t shard_n = m.dp_shard * m.cp;  // FSDP shards over dp_shard x cp
  const bool fsdp = shard_n > 1;
  const bool data_parallel = fsdp || m.dp_replicate > 1;
  const int64_t p_bytes = elem_bytes(cfg.training.dtype);
  const int64_t g_bytes =
      gpu && data_parallel ? elem_bytes(mixed_precision_param(cfg.training, /*cuda=*/true)) : p_bytes;
  const int64_t r_bytes = gpu && data_parallel ? elem_bytes(cfg.training.mixed_precision_reduce) : p_bytes;
  const int64_t state_bytes =
      cfg.optimizer.implementation == OptimizerImplementation::fused_opt_states_bf16 ? 2 : p_bytes;
  const int64_t compute_bytes =
      gpu ? (cfg.training.dtype != DType::float32 ? p_bytes
                                                  : elem_bytes(mixed_precision_param(cfg.training, /*cuda=*/true)))
          : p_bytes;

  const bool compiled = cfg.compile.enable && std::find(cfg.compile.components.begin(), cfg.compile.components.end(),
                                                        "model") != cfg.compile.components.end();
  const bool float8 = gpu && std::any_of(cfg.model.converters.begin(), cfg.model.converters.end(),
                                         [](const std::string& n) { return is_float8_converter(n); });
  // FSDP all-gathers float8 linear weights (1 byte) with enable_fsdp_float8_all_gather, except the
  // filtered ones (the output projection), which stay in the param dtype.
  const bool fp8_gather = float8 && cfg.float8.enable_fsdp_float8_all_gather;
  auto float8_weight = [&](const ParamShape& p) {
    if (!fp8_gather || p.row_numel <= 1 || p.module == "tok_embeddings") return false;
    return std::none_of(cfg.float8.filter_fqns.begin(), cfg.float8.filter_fqns.end(),
                        [&](const std::string& fqn) { return p.name.find(fqn) != std::string::npos; });
  };

  MemoryPlan plan{.mesh = m,
                  .ac = l.ac.name,
                  .microbatch = l.microbatch,
                  .local_batch = l.local_batch,
                  .global_batch = l.local_batch * l.accumulation * m.dp(),
                  .device_memory = c.options.device_memory};
  const Shapes x{.b = l.microbatch,
                 .s = cfg.training.seq_len / m.cp,
                 .t = m.tp,
                 .cp = m.cp,
                 .a = compute_bytes,
                 .fused_norm = gpu,
                 .fused_loss = !gpu && m.tp == 1,
                 .compiled = gpu && compiled,
                 .loss_parallel = gpu && m.tp > 1 && !cfg.parallelism.disable_loss_parallel,
                 .D = args.dim,
                 .Dq = args.n_heads * args.head_dim() / m.tp,
                 .Dkv = args.kv_heads() * args.head_dim() / m.tp,
                 .F = args.ffn_hidden_dim() / m.tp,
                 .V = args.vocab_size / m.tp,
                 .H = args.n_heads / m.tp};

  // Which modules each pp rank holds.
  const auto stages = stages_of(c, m.pp);
  std::vector<RankModules> ranks(static_cast<size_t>(m.pp));
  parallel::PipelineProgram program;
  const int64_t pp_microbatches = m.pp > 1 ? l.local_batch / l.microbatch : 1;
  if (m.pp == 1) {
    for (const auto& p : c.params) ranks[0].modules.insert(p.module);
    ranks[0].stages = {0};
  } else {
    const PipelineSchedule schedule = cfg.parallelism.pipeline_parallel_schedule;
    program = parallel::make_pipeline_program(schedule, m.pp, static_cast<int64_t>(stages.size()), pp_microbatches);
    for (size_t s = 0; s < stages.size(); ++s) {
      RankModules& r = ranks[static_cast<size_t>(program.stage_rank[s])];
      r.stages.push_back(static_cast<int64_t>(s));
      for (const auto& path : stages[s]) r.modules.insert(path);
    }
  }

  // Per stage: activation bytes one microbatch keeps, and the peak of one microbatch's fwd+bwd.
  auto stage_modules = [&](int64_t s) -> std::vector<std::string> {
    if (m.pp == 1) {
      std::vector<std::string> all{"tok_embeddings"};
      for (int64_t i = 0; i < args.n_layers; ++i) all.push_back("layers." + std::to_string(i));
      all.push_back("norm");
      all.push_back("output");
      return all;
    }
    return stages[static_cast<size_t>(s)];
  };
  std::vector<int64_t> unit_grad(c.units.size(), 0);  // unsharded gradient bytes of each unit (FSDP)
  int64_t largest_param = 0;                          // gathered bytes of the largest block weight
  int64_t max_block_unit = 0;                         // gathered bytes of a block's unit
  std::vector<int64_t> unit_gathered(c.units.size(), 0);
  for (const auto& p : c.params) {
    const int64_t numel = p.rows * p.row_numel / (p.tp_dim >= 0 ? m.tp : 1);
    const int64_t u = c.unit_of.at(p.module);
    unit_gathered[static_cast<size_t>(u)] += numel * (float8_weight(p) ? 1 : g_bytes);
    unit_grad[static_cast<size_t>(u)] += numel * g_bytes;
    if (p.module.starts_with("layers.")) largest_param = std::max(largest_param, numel * r_bytes);
  }
  for (size_t u = 0; u < c.units.size(); ++u) {
    if (c.units[u].size() == 1 && c.units[u][0].starts_with("layers."))
      max_block_unit = std::max(max_block_unit, unit_gathered[u]);
  }
  struct StageActivations {
    int64_t saved = 0;
    int64_t peak = 0;
  };
  auto stage_activations = [&](int64_t s) {
    int64_t live = 0;
    int64_t peak = 0;
    int64_t saved = 0;
    std::vector<std::pair<int64_t, BlockAc>> blocks;
    bool head = false;
    for (const auto& path : stage_modules(s)) {
      if (path.starts_with("layers."))
        blocks.emplace_back(std::stoll(path.substr(7)), l.ac.block(std::stoll(path.substr(7))));
      if (path == "output" || (path == "norm" && args.tie_word_embeddings)) head = true;
    }
    for (const auto& [layer, ac] : blocks) {
      const int64_t keep = block_saved(x, ac);
      peak = std::max(peak, live + (ac == BlockAc::none ? keep : block_full(x)));
      live += keep;
    }
    const int64_t head_keep = head ? head_saved(x) : 0;
    if (head) {
      live += head_keep;
      peak = std::max(peak, live + loss_transient(x));
      live -= head_keep;
    }
    saved = live + head_keep;
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      const int64_t keep = block_saved(x, it->second);
      const int64_t recompute = it->second == BlockAc::none ? 0 : block_full(x) - keep;
      const int64_t unit =
          fsdp ? unit_grad[static_cast<size_t>(c.unit_of.at("layers." + std::to_string(it->first)))] : 0;
      peak = std::max(peak, live + recompute + block_backward_transient(x) + unit);
      live -= keep;
    }
    return StageActivations{.saved = saved, .peak = peak};
  };

  // Under PP a stage's output and the gradient sent back for it are one (sequence-parallel) block output.
  const int64_t boundary = x.Tn() * x.D * x.a;
  const int64_t num_stages = m.pp > 1 ? static_cast<int64_t>(stages.size()) : 1;
  MemoryParts worst;
  int64_t worst_gathered = 0;  // the shown rank's FSDP-gathered bytes (one all-gather of all its units)
  int64_t worst_reduced = 0;   // and the bytes its reduce-scatters take in
  int64_t worst_units = 1;
  for (int64_t r = 0; r < m.pp; ++r) {
    const RankModules& rank = ranks[static_cast<size_t>(r)];
    MemoryParts parts;
    int64_t tensors = 0;
    int64_t elements = 0;   // the rank's parameter elements (FSDP shards padded)
    int64_t unsharded = 0;  // local (TP) numel of the rank's parameters
    for (const auto& p : c.params) {
      if (!rank.modules.contains(p.module)) continue;
      const int64_t rows = p.tp_dim == 0 ? p.rows / m.tp : p.rows;
      const int64_t row_numel = p.tp_dim == 1 ? p.row_numel / m.tp : p.row_numel;
      const int64_t local_rows = fsdp ? ceil_div(rows, shard_n) : rows;  // FSDP pads to equal rows
      elements += local_rows * row_numel;
      parts.parameters += local_rows * row_numel * p_bytes;
      unsharded += rows * row_numel;
      ++tensors;
    }
    parts.gradients = parts.parameters;
    // Under PP the microbatches' gradients accumulate unsharded until the step's last backward.
    if (m.pp > 1 && data_parallel) parts.gradients += unsharded * r_bytes;
    // exp_avg, exp_avg_sq like the shard (bf16 under fused_opt_states_bf16); an fp32 step per tensor.
    parts.optimizer = 2 * elements * state_bytes + 4 * tensors;
    // FSDP: the unit in use and the one prefetched are gathered (the last two of the forward are kept
    // for backward); never resharding after forward (the PP default) keeps every unit of the rank.
    std::vector<int64_t> gathered;
    for (size_t u = 0; u < c.units.size(); ++u) {
      const bool on_rank = std::any_of(c.units[u].begin(), c.units[u].end(),
                                       [&](const std::string& path) { return rank.modules.contains(path); });
      gathered.push_back(on_rank ? unit_gathered[u] : 0);
    }
    if (fsdp) {
      ReshardAfterForward policy = cfg.parallelism.fsdp_reshard_after_forward;
      if (m.pp > 1 && policy == ReshardAfterForward::default_) policy = ReshardAfterForward::never;
      if (policy == ReshardAfterForward::never) {
        for (int64_t g : gathered) parts.communication += g;
      } else {
        for (size_t u = 0; u + 1 < gathered.size(); ++u)
          parts.communication = std::max(parts.communication, gathered[u] + gathered[u + 1]);
      }
      // The backward's recompute gathers the unit again while the next one is prefetched.
      if (l.ac.mode != AcMode::none) parts.communication += max_block_unit;
      // CPU (one collective per parameter): a weight gradient autograd made transposed is copied
      // contiguous for its reduce-scatter. GPU: flat collectives add the landing buffer of the unit
      // being gathered and the flat reduce-scatter input of the unit being reduced.
      if (!gpu) parts.communication += largest_param;
      if (gpu) {
        const int64_t largest = *std::max_element(gathered.begin(), gathered.end());
        int64_t largest_grad = 0;  // unsharded gradient bytes (param dtype) of the rank's largest unit
        for (size_t u = 0; u < gathered.size(); ++u) {
          if (gathered[u] > 0) largest_grad = std::max(largest_grad, unit_grad[u]);
        }
        // FSDP2 frees a unit's reduce-scatter input only in the next unit's post-backward, after waiting
        // on it: two are alive at once.
        parts.communication += largest + 2 * (largest_grad / std::max<int64_t>(g_bytes, 1) * r_bytes);
      }
    } else if (m.dp_replicate > 1 && gpu) {
      parts.communication = *std::max_element(gathered.begin(), gathered.end()) / g_bytes * r_bytes;
    }
    // Activations: one microbatch's peak, plus the other microbatches the schedule keeps in flight.
    std::map<int64_t, int64_t> stage_saved;
    int64_t one_peak = 0;
    int64_t one_saved = 0;
    for (int64_t s : rank.stages) {
      const StageActivations a = stage_activations(s);
      // The pipeline keeps each microbatch's stage output until its backward (autograd's root).
      stage_saved[s] = a.saved + (m.pp > 1 && s + 1 < num_stages ? boundary : 0);
      if (a.peak - a.saved > one_peak - one_saved) {
        one_peak = a.peak;
        one_saved = a.saved;
      }
    }
    int64_t in_flight = 1;
    int64_t per_mb = one_saved;
    if (m.pp > 1) {
      const double held = max_in_flight_bytes(program, r, stage_saved, &in_flight);
      parts.activations = static_cast<int64_t>(held) - one_saved + one_peak;
      per_mb = 0;
      for (const auto& [s, bytes] : stage_saved) per_mb += bytes;
    } else {
      parts.activations = one_peak;
    }
    if (m.pp > 1) {
      // torch.distributed.pipelining allocates at setup, and keeps, a receive buffer for every
      // microbatch of every local stage: its input (but on the first stage) and its output's gradient
      // (but on the last).
      for (int64_t s : rank.stages) {
        const int64_t buffers = (s > 0 ? 1 : 0) + (s + 1 < num_stages ? 1 : 0);
        parts.communication += buffers * pp_microbatches * boundary;
      }
    }
    if (r == 0 || parts.total() > worst.total()) {
      worst = parts;
      worst_gathered = 0;
      worst_reduced = 0;
      worst_units = 0;
      for (size_t u = 0; u < gathered.size(); ++u) {
        if (gathered[u] == 0) continue;
        worst_gathered += gathered[u];
        worst_reduced += unit_grad[u] / std::max<int64_t>(g_bytes, 1) * r_bytes;
        ++worst_units;
      }
      worst_units = std::max<int64_t>(worst_units, 1);
      plan.pp_rank = r;
      plan.in_flight = in_flight;
      plan.activations_per_microbatch = per_mb;
    }
  }
  plan.parts = worst;
  plan.microbatches = m.pp > 1 ? pp_microbatches * l.accumulation : l.accumulation;

  // The caching allocator's reserved peak and what lives outside it (see the constants above).
  // What lives across steps: parameters, their sharded gradients and the optimizer state. Everything
  // else is allocated and freed within a step, PP's unsharded gradient accumulators included (made in
  // the first microbatch's backward, freed after the step's reduce-scatter).
  const int64_t states = 2 * worst.parameters + worst.optimizer;
  const int64_t transient = worst.total() - states;
  if (gpu) {
    // One communicator per process group the step uses: FSDP's shard group, HSDP's replicate group,
    // TP, CP, PP's two neighbours (a send/recv pair gets its own) and the loss and grad-norm reductions.
    int64_t communicators = m.world_size() > 1 ? 1 : 0;
    communicators += (fsdp ? 1 : 0) + (m.dp_replicate > 1 ? 1 : 0) + (m.tp > 1 ? 1 : 0) + (m.cp > 1 ? 1 : 0);
    communicators += m.pp > 1 ? 2 : 0;
    plan.outside_allocator = kCudaContext + communicators * kNcclPerCommunicator;
    plan.reserved = states + static_cast<int64_t>(static_cast<double>(transient) * (1 + kTransientFragmentation));
  } else {
    plan.reserved = worst.total();  // CPU: the tracker counts tensors; no caching allocator
  }

  // Speed: model FLOPs per device at the compute efficiency, plus what the layout cannot hide.
  const double per_token = static_cast<double>(c.model.num_flops_per_token(cfg.training.seq_len));
  const double tokens =
      static_cast<double>(l.local_batch * l.accumulation * cfg.training.seq_len) / (m.tp * m.cp * m.pp);
  plan.flops_per_step = per_token * tokens;
  double recompute = 1.0;  // forward is a third of fwd+bwd
  if (l.ac.mode == AcMode::full) recompute += 1.0 / 3.0;
  if (l.ac.mode == AcMode::selective && !l.ac.op) recompute += 1.0 / (3.0 * static_cast<double>(l.ac.every));
  if (l.ac.op) {
    // wk, wo and w3 are recomputed (the elementwise ops are free by comparison).
    const double D = static_cast<double>(args.dim), kv = static_cast<double>(args.kv_heads() * args.head_dim()),
                 F = static_cast<double>(args.ffn_hidden_dim());
    recompute += (D * kv + D * D + D * F) / (2 * D * D + 2 * D * kv + 3 * D * F) / 3.0;
  }
  double efficiency = c.options.mfu;
  if (efficiency <= 0) {
    efficiency = kEagerEfficiency * (gpu && compiled ? kCompileSpeedup : 1.0) * (float8 ? kFloat8Speedup : 1.0);
    efficiency *= cp_efficiency(m.cp);
  }
  plan.compute_efficiency = efficiency;
  if (c.options.peak_flops <= 0) return plan;
  StepTerms& t = plan.time;
  t.compute = plan.flops_per_step / (c.options.peak_flops * efficiency);
  t.recompute = t.compute * (recompute - 1.0);

  // Links: the mesh is laid out pp, dp_replicate, dp_shard, cp, tp from outermost to innermost, so a
  // group stays inside one node while the degrees inside it multiply to at most gpus_per_node.
  const int64_t node = std::max<int64_t>(c.options.gpus_per_node, 1);
  auto bandwidth = [&](int64_t span) { return span <= node ? c.options.intra_node_bw : c.options.inter_node_bw; };
  const double blocks = static_cast<double>(args.n_layers) / static_cast<double>(m.pp);
  const double forwards = static_cast<double>(plan.microbatches);  // microbatches this rank runs per step
  // Forward passes of a block's collectives per microbatch: forward and backward, plus the recompute
  // (full AC redoes them; op AC keeps the reduce-scatters' outputs and redoes the all-gathers).
  double passes = 2.0;
  if (l.ac.mode == AcMode::full) passes += 1.0;
  if (l.ac.mode == AcMode::selective) passes += l.ac.op ? 0.5 : 1.0 / static_cast<double>(l.ac.every);

  // TP with sequence parallelism: per block two all-gathers and two reduce-scatters of the (T, D)
  // activations, each (t-1)/t of them through a GPU's link, on the critical path. Async TP splits each
  // into t chunks that overlap the matmul over the previous chunk: only the first chunk is exposed.
  if (m.tp > 1) {
    const double bytes = 4.0 * static_cast<double>(x.T() * x.D * x.a) * static_cast<double>(m.tp - 1) /
                         static_cast<double>(m.tp) * passes * blocks * forwards;
    t.tp = bytes / bandwidth(m.tp);
    if (cfg.parallelism.enable_async_tensor_parallel) t.tp /= static_cast<double>(m.tp);
  }
  // CP (allgather rotation): each block gathers the whole sequence's K and V before attention and
  // reduce-scatters their gradients in backward, blocking.
  if (m.cp > 1) {
    const double bytes =
        2.0 * static_cast<double>(x.T() * x.Dkv * x.a) * static_cast<double>(m.cp - 1) * passes * blocks * forwards;
    t.cp = bytes / bandwidth(m.cp * m.tp);
  }
  // FSDP: all-gather every unit in forward, again in backward when resharded after forward, and
  // reduce-scatter the gradients (reduce dtype); each (n-1)/n of the bytes through a GPU's link. Under
  // PP units stay gathered and reduce once per step; otherwise every microbatch of gradient
  // accumulation gathers and reduces again. Prefetch hides it behind compute but for the first unit's
  // gather and the last one's reduce-scatter of each pass.
  if (fsdp || m.dp_replicate > 1) {
    ReshardAfterForward policy = cfg.parallelism.fsdp_reshard_after_forward;
    if (m.pp > 1 && policy == ReshardAfterForward::default_) policy = ReshardAfterForward::never;
    const double rounds = m.pp > 1 ? 1.0 : static_cast<double>(l.accumulation);
    double seconds = 0;
    if (fsdp) {
      const double share = static_cast<double>(shard_n - 1) / static_cast<double>(shard_n);
      const double gathers = policy == ReshardAfterForward::never ? 1.0 : 2.0;
      const double bytes =
          (gathers * static_cast<double>(worst_gathered) + static_cast<double>(worst_reduced)) * share * rounds;
      seconds += bytes / bandwidth(shard_n * m.tp);
    }
    if (m.dp_replicate > 1) {
      // HSDP / DDP: an all-reduce of the (sharded) gradients across the replicas, 2 (r-1)/r of them.
      const double r = static_cast<double>(m.dp_replicate);
      const double grads = static_cast<double>(worst_reduced) / static_cast<double>(std::max<int64_t>(shard_n, 1));
      seconds += 2.0 * (r - 1) / r * grads * rounds / bandwidth(m.world_size() / m.pp);
    }
    const double hidden_by = t.compute + t.recompute;
    t.fsdp = std::max(0.0, seconds - hidden_by) + 2.0 * seconds / (static_cast<double>(worst_units) * rounds);
  }
  // PP: the schedule's own program simulated with a forward of 1, a backward of 2 (+1 under full AC)
  // and each stage-to-stage transfer in those units; its idle fraction is the bubble.
  if (m.pp > 1) {
    const double busy = t.compute + t.recompute + t.tp + t.cp;
    const double backward = 2.0 + 3.0 * (recompute - 1.0);
    const double units = forwards * static_cast<double>(ranks[0].stages.size()) * (1.0 + backward);
    const double forward_seconds = busy / units;
    const double transfer = static_cast<double>(boundary) / bandwidth(m.world_size() / m.pp);
    parallel::PipelineCosts costs{.forward = 1.0,
                                  .backward = backward,
                                  .backward_input = backward / 2,
                                  .backward_weight = backward / 2,
                                  .transfer = transfer / forward_seconds};
    // Long programs (a search's thousands of microbatches) take the schedule's closed form instead: the
    // simulation's cost grows with the actions while the two agree ever more closely.
    const bool simulate = pp_microbatches * num_stages <= 1024;
    const double bubble = simulate ? parallel::bubble_fraction(parallel::simulate_pipeline(program, costs))
                                   : parallel::theoretical_bubble(cfg.parallelism.pipeline_parallel_schedule, m.pp,
                                                                  pp_microbatches, num_stages / m.pp, costs);
    t.pp = busy * bubble / (1.0 - bubble);
  }
  plan.step_seconds = t.total();
  plan.tokens_per_second = tokens / plan.step_seconds;
  return plan;
}

Context make_context(const Llama3& model, const JobConfig& config, const PlanOptions& options) {
  Context c{.model = model,
            .config = config,
            .options = options,
            .params = param_shapes(model),
            .units = data_parallel_units(model),
            .unit_of = {}};
  for (size_t u = 0; u < c.units.size(); ++u) {
    for (const auto& path : c.units[u]) c.unit_of[path] = static_cast<int64_t>(u);
  }
  return c;
}

void check_layout(const Llama3Args& args, const JobConfig& cfg, const dist::MeshShape& m) {
  TITAN_CHECK_VALUE(args.n_heads % m.tp == 0 && args.kv_heads() % m.tp == 0,
                    "[titan::llama3::plan_memory] expected n_heads ({}) and n_kv_heads ({}) divisible by "
                    "parallelism.tensor_parallel_degree, got {}. Choose a degree that divides both.",
                    args.n_heads, args.kv_heads(), m.tp);
  const int64_t divisor = m.cp * (m.cp > 1 ? 2 : 1) * m.tp;
  if (cfg.training.seq_len % divisor != 0) {
    throw ConfigError(
        "training.seq_len",
        fmt::format("[titan::llama3::plan_memory] expected training.seq_len divisible by {} "
                    "(context_parallel_degree {}{} x tensor_parallel_degree {}), got {}. Choose a "
                    "multiple of {}.",
                    divisor, m.cp, m.cp > 1 ? " x 2 (headtail)" : "", m.tp, cfg.training.seq_len, divisor));
  }
}

void check_options(const PlanOptions& o, int64_t world, const char* where) {
  TITAN_CHECK_VALUE(o.mfu >= 0 && o.mfu <= 1,
                    "[titan::llama3::{}] expected an MFU in (0, 1] (0: the calibrated default), got {}. Pass e.g. "
                    "--mfu 40%.",
                    where, o.mfu);
  TITAN_CHECK_VALUE(o.gpus_per_node >= 1, "[titan::llama3::{}] expected --gpus-per-node >= 1, got {}.", where,
                    o.gpus_per_node);
  TITAN_CHECK_VALUE(o.intra_node_bw > 0 && o.inter_node_bw > 0,
                    "[titan::llama3::{}] expected bandwidths > 0 bytes/s, got --intra-node-bw {} and "
                    "--inter-node-bw {}. Pass e.g. --intra-node-bw 450GB --inter-node-bw 50GB.",
                    where, o.intra_node_bw, o.inter_node_bw);
  // A job of several nodes fills each; one smaller than a node is a part of one.
  TITAN_CHECK_VALUE(!o.gpu || world <= o.gpus_per_node || world % o.gpus_per_node == 0,
                    "[titan::llama3::{}] expected --gpus to be a multiple of --gpus-per-node ({}) when it spans "
                    "nodes, got {}. Use whole nodes or set --gpus-per-node.",
                    where, o.gpus_per_node, world);
}

}  // namespace

MemoryPlan plan_memory(const Llama3& model, const JobConfig& config, const PlanOptions& options) {
  const Llama3Args& args = model.args();
  const ParallelismConfig& p = config.parallelism;
  int64_t world = options.world_size;
  if (world == 0) {
    world = p.pipeline_parallel_degree * p.data_parallel_replicate_degree * p.context_parallel_degree *
            p.tensor_parallel_degree * std::max<int64_t>(p.data_parallel_shard_degree, 1);
  }
  TITAN_CHECK_VALUE(world >= 1, "[titan::llama3::plan_memory] expected a world size >= 1, got {}. Pass --gpus N.",
                    world);
  check_options(options, world, "plan_memory");
  const dist::MeshShape mesh = dist::mesh_shape(p, world);
  check_layout(args, config, mesh);
  TITAN_CHECK_NOT_IMPLEMENTED(p.expert_parallel_degree == 1,
                              "[titan::llama3::plan_memory] expected parallelism.expert_parallel_degree = 1, got {}: "
                              "Llama 3 is dense.",
                              p.expert_parallel_degree);
  const Context c = make_context(model, config, options);
  Layout l{.mesh = mesh, .ac = ac_policy(config.activation_checkpoint, args)};
  const int64_t lbs = config.training.local_batch_size;
  const int64_t dp = mesh.dp();
  const int64_t global = config.training.global_batch_size > 0 ? config.training.global_batch_size : lbs * dp;
  if (global % (lbs * dp) != 0) {
    throw ConfigError("training.global_batch_size",
                      fmt::format("[titan::llama3::plan_memory] expected training.global_batch_size divisible by "
                                  "local_batch_size x data-parallel degree = {} x {}, got {}. Change one of them.",
                                  lbs, dp, global));
  }
  l.local_batch = lbs;
  l.accumulation = global / (lbs * dp);
  l.microbatch = lbs;
  if (mesh.pp > 1) {
    l.microbatch = p.pipeline_parallel_microbatch_size;
    if (l.microbatch < 1 || lbs % l.microbatch != 0) {
      throw ConfigError("parallelism.pipeline_parallel_microbatch_size",
                        fmt::format("[titan::llama3::plan_memory] expected pipeline_parallel_microbatch_size to "
                                    "divide training.local_batch_size ({}), got {}. Choose a divisor.",
                                    lbs, l.microbatch));
    }
  }
  return evaluate(c, l);
}

std::vector<MemoryPlan> search_layouts(const Llama3& model, const JobConfig& config, const PlanOptions& options,
                                       const SearchOptions& search) {
  TITAN_CHECK_VALUE(search.gpus >= 1, "[titan::llama3::search_layouts] expected --gpus N >= 1, got {}.", search.gpus);
  TITAN_CHECK_VALUE(options.device_memory > 0,
                    "[titan::llama3::search_layouts] expected a device memory, got none. Pass --device-memory 80GB "
                    "or a GPU name (H100).");
  check_options(options, search.gpus, "search_layouts");
  const Llama3Args& args = model.args();
  const Context c = make_context(model, config, options);
  // The global batch stays the config's: its global_batch_size, or local_batch_size x the data-parallel
  // degree the config's own layout has on this many GPUs.
  int64_t global = config.training.global_batch_size;
  if (global <= 0) {
    const ParallelismConfig& p = config.parallelism;
    const int64_t others = p.pipeline_parallel_degree * p.context_parallel_degree * p.tensor_parallel_degree;
    global = config.training.local_batch_size * std::max<int64_t>(search.gpus / std::max<int64_t>(others, 1), 1);
  }
  std::vector<AcPolicy> policies;
  for (const char* option : {"", "2", "op", "full"}) {
    ActivationCheckpointConfig ac = config.activation_checkpoint;
    ac.mode = std::string_view(option).empty()     ? AcMode::none
              : std::string_view(option) == "full" ? AcMode::full
                                                   : AcMode::selective;
    if (ac.mode == AcMode::selective) ac.selective_ac_option = option;
    policies.push_back(ac_policy(ac, args));
  }
  std::vector<MemoryPlan> fits;
  for (int64_t tp = 1; tp <= 8 && tp <= search.gpus; tp *= 2) {
    if (args.n_heads % tp != 0 || args.kv_heads() % tp != 0) continue;
    for (int64_t cp = 1; cp <= 8 && tp * cp <= search.gpus; cp *= 2) {
      if (config.training.seq_len % (cp * (cp > 1 ? 2 : 1) * tp) != 0) continue;
      for (int64_t pp = 1; tp * cp * pp <= search.gpus && pp <= args.n_layers / 2; pp *= 2) {
        if (search.gpus % (tp * cp * pp) != 0) continue;
        const int64_t dp = search.gpus / (tp * cp * pp);
        if (global % dp != 0) continue;
        const int64_t per_rank = global / dp;  // sequences per dp rank per step
        for (int64_t mb = 1; mb <= per_rank; mb *= 2) {
          if (per_rank % mb != 0) continue;
          Layout l{.mesh = {.pp = pp, .dp_replicate = 1, .dp_shard = dp, .cp = cp, .tp = tp}};
          if (pp > 1) {
            l.local_batch = per_rank;
            l.accumulation = 1;
            l.microbatch = mb;
            if (per_rank / mb < pp) continue;  // the schedule needs pp microbatches
          } else {
            l.local_batch = mb;
            l.accumulation = per_rank / mb;
            l.microbatch = mb;
          }
          for (const AcPolicy& ac : policies) {
            l.ac = ac;
            MemoryPlan plan;
            try {
              plan = evaluate(c, l);
            } catch (const c10::Error&) {
              continue;  // a split or schedule this layout cannot have (e.g. more stages than layers)
            }
            if (plan.fits()) fits.push_back(std::move(plan));
          }
        }
      }
    }
  }
  // Fastest first; among equal speeds the one with more memory left at its reserved peak.
  std::sort(fits.begin(), fits.end(), [&](const MemoryPlan& a, const MemoryPlan& b) {
    if (a.tokens_per_second != b.tokens_per_second) return a.tokens_per_second > b.tokens_per_second;
    return a.headroom() > b.headroom();
  });
  if (static_cast<int64_t>(fits.size()) > search.limit) fits.resize(static_cast<size_t>(search.limit));
  return fits;
}

std::string format_bytes(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / kGiB); }

std::string largest_terms(const MemoryPlan& p) {
  const StepTerms& t = p.time;
  std::vector<std::pair<double, const char*>> terms{{t.compute, "compute"}, {t.recompute, "recompute"},
                                                    {t.fsdp, "FSDP comm"},  {t.tp, "TP comm"},
                                                    {t.cp, "CP comm"},      {t.pp, "PP bubble"}};
  std::sort(terms.begin(), terms.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string out;
  const double total = std::max(t.total(), 1e-30);
  for (size_t i = 0; i < 3 && terms[i].first > 0; ++i) {
    out += fmt::format("{}{} {:.0f}%", out.empty() ? "" : ", ", terms[i].second, 100 * terms[i].first / total);
  }
  return out;
}

std::string format_plan(const MemoryPlan& p) {
  const MemoryParts& m = p.parts;
  std::string out = fmt::format(
      "layout        {}\n"
      "AC            {}; microbatch {} sequences, {} per step; {} in flight on pp rank {}\n"
      "per rank (pp rank {}):\n"
      "  parameters     {:>12}  ({} B)\n"
      "  gradients      {:>12}  ({} B)\n"
      "  optimizer      {:>12}  ({} B)\n"
      "  activations    {:>12}  ({} per microbatch kept for backward)\n"
      "  communication  {:>12}\n"
      "  total          {:>12}  (tensors at their peak)",
      p.mesh, p.ac, p.microbatch, p.microbatches, p.in_flight, p.pp_rank, p.pp_rank, format_bytes(m.parameters),
      m.parameters, format_bytes(m.gradients), m.gradients, format_bytes(m.optimizer), m.optimizer,
      format_bytes(m.activations), format_bytes(p.activations_per_microbatch), format_bytes(m.communication),
      format_bytes(m.total()));
  if (p.outside_allocator > 0) {  // a GPU plan: a CPU run has no caching allocator, context or NCCL
    out += fmt::format(
        "\n  reserved       {:>12}  (the caching allocator's peak: what torchtitan logs as memory)"
        "\n  outside        {:>12}  (CUDA context, NCCL buffers)",
        format_bytes(p.reserved), format_bytes(p.outside_allocator));
  }
  if (p.device_memory > 0) {
    out += fmt::format("\n  needs          {:>12}  of {} ({:.1f}%): {}\n", format_bytes(p.needed()),
                       format_bytes(p.device_memory),
                       100.0 * static_cast<double>(p.needed()) / static_cast<double>(p.device_memory),
                       p.fits() ? "fits" : "DOES NOT FIT");
  } else {
    out += "\n";
  }
  out += fmt::format("FLOPs         {:.3e} per device per step", p.flops_per_step);
  if (p.step_seconds > 0) {
    const StepTerms& t = p.time;
    out += fmt::format(
        "; step {:.2f} s, {:.0f} tokens/s per device\n"
        "step time     compute {:.2f} s at {:.1f}% of peak, recompute {:.2f}, FSDP {:.2f}, TP {:.2f}, CP {:.2f}, "
        "PP bubble {:.2f} (largest: {})",
        p.step_seconds, p.tokens_per_second, t.compute, 100 * p.compute_efficiency, t.recompute, t.fsdp, t.tp, t.cp,
        t.pp, largest_terms(p));
  }
  return out + "\n";
}

std::string format_search(const std::vector<MemoryPlan>& plans) {
  std::string out =
      fmt::format("{:>4} {:>8} {:>3} {:>3} {:>3} {:>12} {:>3} {:>12} {:>10} {:>9} {:>8}  {}\n", "#", "dp_shard", "tp",
                  "pp", "cp", "AC", "mb", "reserved GiB", "tokens/s", "step s", "free GiB", "largest time terms");
  int64_t i = 0;
  for (const auto& p : plans) {
    out += fmt::format("{:>4} {:>8} {:>3} {:>3} {:>3} {:>12} {:>3} {:>12.2f} {:>10.1f} {:>9.2f} {:>8.2f}  {}\n", ++i,
                       p.mesh.dp_shard, p.mesh.tp, p.mesh.pp, p.mesh.cp, p.ac, p.microbatch,
                       static_cast<double>(p.reserved) / kGiB, p.tokens_per_second, p.step_seconds,
                       static_cast<double>(p.headroom()) / kGiB, largest_terms(p));
  }
  if (plans.empty()) out += "no layout fits\n";
  return out;
}

std::string plan_json(const MemoryPlan& p) {
  const MemoryParts& m = p.parts;
  const StepTerms& t = p.time;
  return fmt::format(
      "{{\"mesh\": {{\"pp\": {}, \"dp_replicate\": {}, \"dp_shard\": {}, \"cp\": {}, \"tp\": {}}}, "
      "\"ac\": \"{}\", \"microbatch\": {}, \"microbatches\": {}, \"local_batch\": {}, \"global_batch\": {}, "
      "\"pp_rank\": {}, \"in_flight\": {}, "
      "\"bytes\": {{\"parameters\": {}, \"gradients\": {}, \"optimizer\": {}, \"activations\": {}, "
      "\"communication\": {}, \"total\": {}, \"reserved\": {}, \"outside_allocator\": {}, \"needed\": {}, "
      "\"device_memory\": {}}}, \"fits\": {}, "
      "\"flops_per_step\": {:.6e}, \"compute_efficiency\": {:.4f}, "
      "\"seconds\": {{\"compute\": {:.6g}, \"recompute\": {:.6g}, \"fsdp\": {:.6g}, \"tp\": {:.6g}, "
      "\"cp\": {:.6g}, \"pp\": {:.6g}, \"step\": {:.6g}}}, \"tokens_per_second\": {:.6g}}}",
      p.mesh.pp, p.mesh.dp_replicate, p.mesh.dp_shard, p.mesh.cp, p.mesh.tp, p.ac, p.microbatch, p.microbatches,
      p.local_batch, p.global_batch, p.pp_rank, p.in_flight, m.parameters, m.gradients, m.optimizer, m.activations,
      m.communication, m.total(), p.reserved, p.outside_allocator, p.needed(), p.device_memory,
      p.fits() ? "true" : "false", p.flops_per_step, p.compute_efficiency, t.compute, t.recompute, t.fsdp, t.tp, t.cp,
      t.pp, p.step_seconds, p.tokens_per_second);
}

std::string plan_toml(const MemoryPlan& p) {
  std::string ac = "mode = \"none\"";
  if (p.ac == "full") ac = "mode = \"full\"";
  if (p.ac == "op") ac = "mode = \"selective\"\nselective_ac_option = \"op\"";
  if (p.ac.starts_with("selective ")) {
    ac = fmt::format("mode = \"selective\"\nselective_ac_option = \"{}\"", p.ac.substr(10));
  }
  return fmt::format(
      "# titan-plan's layout: {:.0f} tokens/s per device predicted, {} reserved of {} per device.\n"
      "[parallelism]\n"
      "data_parallel_replicate_degree = {}\n"
      "data_parallel_shard_degree = {}\n"
      "tensor_parallel_degree = {}\n"
      "pipeline_parallel_degree = {}\n"
      "pipeline_parallel_microbatch_size = {}\n"
      "context_parallel_degree = {}\n\n"
      "[training]\n"
      "local_batch_size = {}\n"
      "global_batch_size = {}\n\n"
      "[activation_checkpoint]\n"
      "{}\n",
      p.tokens_per_second, format_bytes(p.reserved), format_bytes(p.device_memory), p.mesh.dp_replicate,
      p.mesh.dp_shard, p.mesh.tp, p.mesh.pp, p.microbatch, p.mesh.cp, p.local_batch, p.global_batch, ac);
}

}  // namespace titan::llama3
