// SPDX-License-Identifier: BSD-3-Clause
// One layout's plan. The job's ParallelPlan for the layout (parallel::plan, as the Trainer computes it) is
// applied on the meta device (memory_plan_applied.cpp): parameters, gradients and optimizer state are the bytes of
// the shards it leaves. The rest is modelled from the same plan: activations add up each block's terms
// (memory_plan_activations.cpp) under the plan's activation checkpointing over one microbatch's forward and
// backward, and over the pipeline schedule's program for the microbatches in flight; communication is the
// gathered units and collective buffers (memory_plan_buffers.cpp). On GPU the terms that make it predict
// torchtitan's published runs follow (allocator, CUDA context, NCCL); the step time is memory_plan_time.cpp's.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "memory_plan_detail.hpp"
#include "titan/core/error.hpp"
#include "titan/models/decoder_spec.hpp"
#include "titan/models/multi_token_prediction.hpp"
#include "titan/parallel/pipeline_schedule.hpp"
#include "titan/quant/nf4.hpp"

namespace titan::planner::detail {
namespace {

// The terms below make the plan predict torchtitan's published H100 runs (benchmarks/
// llama3_h100_202412_torchtitan.md); docs/memory_planner.md compares every row. These are argued from
// what CUDA and NCCL allocate; the two fitted fractions are memory_plan_calibration.hpp's.

// A process's CUDA context, kernel images and libraries (cuBLAS, NCCL): about 600 MiB on an H100 with
// torch loaded, outside the allocator.
constexpr int64_t kCudaContext = 600 * kMiB;
// NCCL's own buffers per communicator, cudaMalloc'd by NCCL and so outside the allocator too: per
// channel a 4 MiB Simple, ~4.5 MiB LL128 and 256 KiB LL buffer for each of the ring's two peers, with
// 32 channels on NVLink.
constexpr int64_t kNcclPerCommunicator = 32 * 2 * (8 * kMiB + kMiB * 3 / 4);

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

bool float8_converted(const JobConfig& config) {
  return std::any_of(config.model.converters.begin(), config.model.converters.end(),
                     [](const std::string& n) { return is_float8_converter(n); });
}

Dtypes dtypes_of(const Context& c, const parallel::ParallelPlan& plan, const dist::MeshShape& m) {
  const TrainingConfig& t = c.config.training;
  const bool data_parallel = m.dp_shard * m.cp > 1 || m.dp_replicate > 1;
  Dtypes d;
  d.param = elem_bytes(t.dtype);
  d.gathered = data_parallel ? elem_bytes(plan.data_parallel.options.param_dtype) : d.param;
  d.reduced = data_parallel ? elem_bytes(plan.data_parallel.options.reduce_dtype) : d.param;
  d.state = c.config.optimizer.implementation == OptimizerImplementation::fused_opt_states_bf16 ? 2 : d.param;
  // Activations: the parameters' dtype, or over fp32 parameters mixed precision's (FSDP's gathers or autocast).
  d.compute = t.dtype != DType::float32 ? d.param : elem_bytes(mixed_precision_param(t, c.options.gpu));
  return d;
}

Shapes shapes_of(const Context& c, const parallel::ParallelPlan& plan, const Layout& l, const Dtypes& d,
                 bool compiled) {
  const dist::MeshShape& m = l.mesh;
  const bool gpu = c.options.gpu;
  Shapes x;
  x.b = l.microbatch;
  x.s = c.config.training.seq_len / m.cp;
  x.tp = m.tp;
  x.cp = m.cp;
  x.bytes = d.compute;
  x.fused_norm = gpu;
  x.ep = m.ep;
  x.etp = m.etp;
  // EP's experts without efsdp keep their param dtype and are cast for the grouped GEMM; over efsdp the
  // gather lands in the compute dtype (counted with FSDP's buffers).
  x.expert_copy = gpu && d.gathered != d.param && (m.ep == 1 || m.efsdp() == 1) ? d.gathered : 0;
  x.fused_loss = !gpu && m.tp == 1;
  x.compiled = gpu && compiled;
  // What the plan's styles do to activations: a head that keeps the logits vocab-sharded (loss parallel), and
  // block outputs sequence-sharded between blocks (sequence parallelism).
  bool vocab_sharded = false;
  for (const auto& [path, style] : plan.tensor_parallel.styles) {
    if (const auto* colwise = std::get_if<parallel::ColwiseParallel>(&style)) vocab_sharded |= colwise->loss_parallel;
    if (const auto* rowwise = std::get_if<parallel::RowwiseParallel>(&style))
      x.sequence_parallel |= rowwise->output_layout == parallel::Placement::shard(1);
  }
  x.loss_parallel = gpu && vocab_sharded;
  x.D = c.model.shape().dim;
  x.V = c.model.shape().vocab_size / (vocab_sharded ? m.tp : 1);
  return x;
}

// The stages of the plan's pipeline and the ranks that run them (the whole model on one rank without it).
Stages stages_of(const parallel::ParallelPlan& plan, const Layout& l, const std::vector<RankShards>& held) {
  Stages s;
  if (plan.pipeline.stages.empty()) {
    s.modules = {held.front().modules};
    s.of_rank = {{0}};
    return s;
  }
  s.modules = plan.pipeline.stages;
  s.microbatches = l.local_batch / l.microbatch;
  s.program = parallel::make_pipeline_program(plan.pipeline.schedule, l.mesh.pp, static_cast<int64_t>(s.modules.size()),
                                              s.microbatches);
  s.of_rank.resize(static_cast<size_t>(l.mesh.pp));
  for (size_t stage = 0; stage < s.modules.size(); ++stage)
    s.of_rank[static_cast<size_t>(s.program.stage_rank[stage])].push_back(static_cast<int64_t>(stage));
  return s;
}

Walk make_walk(const Context& c, const Layout& l, const parallel::ParallelPlan& plan,
               const std::vector<RankShards>& held) {
  Walk w{.c = c, .l = l, .plan = plan};
  w.bytes = dtypes_of(c, plan, l.mesh);
  const auto& components = c.config.compile.components;
  w.compiled = c.config.compile.enable && std::find(components.begin(), components.end(), "model") != components.end();
  w.float8 = c.options.gpu && float8_converted(c.config);
  w.x = shapes_of(c, plan, l, w.bytes, w.compiled);
  // Every block's terms (the model's own modules: dense or MoE, its attention).
  w.terms.resize(static_cast<size_t>(c.model.shape().n_layers));
  for (const auto& block : c.model.layers)
    w.terms[static_cast<size_t>(block->layer_id)] = block_terms(*block, c.attention, w.x);
  // Multi-token prediction (DeepSeek-V3): each depth keeps, until backward, its two norms and their joined output
  // (T, 2D) that eh_proj reads, its block (never checkpointed) and its own head's and loss's tensors.
  for (const auto& mtp : models::mtp_modules(c.model)) {
    for (const auto& depth : mtp->modules) {
      w.mtp += 2 * models::rms_norm_saved(w.x.tokens(), w.x.D, w.x) + 2 * w.x.tokens() * w.x.D * w.x.bytes +
               block_terms(*depth->block, c.attention, w.x).full + head_saved(w.x);
    }
  }
  w.stages = stages_of(plan, l, held);
  w.fsdp = l.mesh.dp_shard * l.mesh.cp > 1;
  // Under PP a stage's output and the gradient sent back for it are one (sequence-parallel) block output.
  w.boundary = w.x.Tn() * w.x.D * w.x.bytes;
  for (const RankShards& rank : held) {
    for (const HeldUnit& u : rank.units) {
      if (u.layer >= 0) w.max_block_unit = std::max(w.max_block_unit, gathered_bytes(u, w.bytes));
    }
  }
  return w;
}

struct StageActivations {
  int64_t saved = 0;  // what one microbatch keeps on the stage until its backward
  int64_t peak = 0;   // the most it holds during its forward and backward
};

// One microbatch through a stage's blocks (each checkpointed as the plan says) and, on the last, the head;
// `unit_grad`: per block, its units' unsharded gradients before their reduce-scatter (FSDP).
StageActivations stage_activations(const Walk& w, const std::vector<std::string>& modules,
                                   const std::map<int64_t, int64_t>& unit_grad) {
  int64_t live = 0, peak = 0;
  std::vector<std::pair<int64_t, BlockAc>> blocks;
  bool head = false;
  for (const auto& path : modules) {
    const int64_t layer = models::ModelParts::layer_index(path);
    if (layer >= 0) blocks.emplace_back(layer, block_ac(w.plan.activation_checkpoint, path));
    head |= path == w.c.spec.pipeline.output_modules.back();
  }
  for (const auto& [layer, ac] : blocks) {
    const BlockTerms& b = w.terms[static_cast<size_t>(layer)];
    const int64_t keep = b.block_activations(ac);
    peak = std::max(peak, live + (ac == BlockAc::none ? keep : b.full) + b.forward);
    live += keep;
  }
  const int64_t head_keep = head ? head_saved(w.x) + w.mtp : 0;
  if (head) peak = std::max(peak, live + head_keep + loss_transient(w.x));
  const int64_t saved = live + head_keep;
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const BlockTerms& b = w.terms[static_cast<size_t>(it->first)];
    const int64_t keep = b.block_activations(it->second);
    const int64_t recompute = it->second == BlockAc::none ? 0 : b.full - keep;
    const auto unit = unit_grad.find(it->first);
    peak = std::max(peak, live + recompute + b.backward + (unit == unit_grad.end() ? 0 : unit->second));
    live -= keep;
  }
  return {.saved = saved, .peak = peak};
}

// The rank's activations: one microbatch's peak, plus the other microbatches the schedule keeps in flight.
void add_activations(const Walk& w, int64_t r, const RankShards& held, RankPlan* out) {
  std::map<int64_t, int64_t> unit_grad;
  for (const HeldUnit& u : held.units) {
    if (w.fsdp && u.layer >= 0) unit_grad[u.layer] += u.trained_numel * w.bytes.gathered;
  }
  const bool pipelined = w.l.mesh.pp > 1;
  const auto num_stages = static_cast<int64_t>(w.stages.modules.size());
  std::map<int64_t, int64_t> stage_saved;
  int64_t one_peak = 0, one_saved = 0;
  for (int64_t s : w.stages.of_rank[static_cast<size_t>(r)]) {
    const StageActivations a = stage_activations(w, w.stages.modules[static_cast<size_t>(s)], unit_grad);
    // The pipeline keeps each microbatch's stage output until its backward (autograd's root).
    stage_saved[s] = a.saved + (pipelined && s + 1 < num_stages ? w.boundary : 0);
    if (a.peak - a.saved > one_peak - one_saved) {
      one_peak = a.peak;
      one_saved = a.saved;
    }
  }
  if (!pipelined) {
    out->parts.activations = one_peak;
    out->per_microbatch = one_saved;
    return;
  }
  const double in_flight = max_in_flight_bytes(w.stages.program, r, stage_saved, &out->in_flight);
  out->parts.activations = static_cast<int64_t>(in_flight) - one_saved + one_peak;
  out->per_microbatch = 0;
  for (const auto& [s, bytes] : stage_saved) out->per_microbatch += bytes;
}

// One pp rank: its states as parallelize left them, its modelled activations and buffers.
RankPlan rank_plan(const Walk& w, int64_t r, const RankShards& held) {
  const Dtypes& d = w.bytes;
  RankPlan out;
  // A QLoRA base in NF4 (quant::nf4_nbytes: 0.5 + 1/64 + d.param / (64 x 256) bytes an element), the rest as is.
  out.parts.parameters = held.local_numel * d.param;
  for (const int64_t n : held.nf4_numels) out.parts.parameters += quant::nf4_nbytes(n, d.param) - n * d.param;
  // Gradients like the shards that train (a reduced shard's .grad is in its parameter's dtype); under a pipeline
  // also the step's unsharded accumulators, in the reduce dtype, until the last microbatch's backward.
  out.sharded_gradients = held.trained_numel * d.param;
  out.parts.gradients = out.sharded_gradients + held.deferred_numel * d.reduced;
  // AdamW's exp_avg and exp_avg_sq like each shard that trains, and an fp32 step per tensor (src/optim/adamw.cpp).
  out.parts.optimizer = 2 * held.trained_numel * d.state + 4 * held.trained_tensors;
  out.parts.communication = communication_bytes(w, r, held);
  add_activations(w, r, held, &out);
  add_unit_traffic(w, held, &out);
  out.experts = held.expert_numel;
  for (const std::string& path : held.modules) {
    const int64_t layer = models::ModelParts::layer_index(path);
    if (layer >= 0) out.expert_dispatch = std::max(out.expert_dispatch, w.terms[static_cast<size_t>(layer)].dispatch);
  }
  return out;
}

// The caching allocator's reserved peak and what lives outside it (see the constants above).
void add_allocator(const Walk& w, const RankPlan& rank, MemoryPlan* plan) {
  const MemoryParts& parts = rank.parts;
  const dist::MeshShape& m = w.l.mesh;
  if (!w.c.options.gpu) {
    plan->reserved = parts.total();  // CPU: the tracker counts tensors; no caching allocator
    return;
  }
  // One communicator per process group the step uses: FSDP's shard group, HSDP's replicate group,
  // TP, CP, PP's two neighbours (a send/recv pair gets its own) and the loss and grad-norm reductions.
  int64_t communicators = m.world_size() > 1 ? 1 : 0;
  communicators += (w.fsdp ? 1 : 0) + (m.dp_replicate > 1 ? 1 : 0) + (m.tp > 1 ? 1 : 0) + (m.cp > 1 ? 1 : 0);
  communicators += m.pp > 1 ? 2 : 0;
  communicators += (m.ep > 1 ? 1 : 0) + (m.ep > 1 && m.efsdp() > 1 ? 1 : 0);  // EP's all-to-alls, efsdp's reduce
  plan->outside_allocator = kCudaContext + communicators * kNcclPerCommunicator;
  // The published memory is torch.cuda.memory_stats' reserved_bytes.all.peak: the segments the caching
  // allocator took from cudaMalloc, not the live tensors. What lives across steps (parameters, their sharded
  // gradients, the optimizer state) is allocated once, each in a block of its own size (rounded to 2 MiB: under
  // 0.1% here). Everything else is allocated and freed within a step (PP's unsharded gradient accumulators too),
  // again in other sizes every microbatch; the allocator splits cached blocks for smaller requests and keeps
  // them, so its segments outgrow the live bytes by a fitted fraction. Without PP a backward frees what its
  // forward allocated in reverse order; under PP a microbatch's backward frees its activations while later
  // microbatches' stay allocated above them, which leaves holes: a fraction of its own.
  const int64_t states = parts.parameters + rank.sharded_gradients + parts.optimizer;
  const int64_t transient = parts.total() - states;
  const Calibration& k = w.c.calibration;
  const double fragmentation = m.pp > 1 ? k.pipeline_fragmentation : k.transient_fragmentation;
  plan->reserved = states + static_cast<int64_t>(static_cast<double>(transient) * (1 + fragmentation));
}

}  // namespace

MemoryPlan evaluate(const Context& c, const Layout& l) {
  const parallel::ParallelPlan plan = job_plan(c, l);
  const std::vector<RankShards>& held = applied_shards(c, plan, l.mesh);
  const Walk w = make_walk(c, l, plan, held);
  MemoryPlan out{.mesh = l.mesh,
                 .ac = ac_name(l.ac, c),
                 .microbatch = l.microbatch,
                 .local_batch = l.local_batch,
                 .global_batch = l.local_batch * l.accumulation * l.mesh.dp(),
                 .device_memory = c.options.device_memory,
                 .params = c.params,
                 .trainable_params = c.trainable_params};
  // The pp rank shown is the one with the largest total.
  RankPlan worst;
  for (int64_t r = 0; r < l.mesh.pp; ++r) {
    RankPlan rank = rank_plan(w, r, held[static_cast<size_t>(r)]);
    if (r > 0 && rank.parts.total() <= worst.parts.total()) continue;
    worst = std::move(rank);
    out.pp_rank = r;
  }
  out.parts = worst.parts;
  out.in_flight = worst.in_flight;
  out.activations_per_microbatch = worst.per_microbatch;
  out.expert_dispatch = worst.expert_dispatch;
  out.microbatches = l.mesh.pp > 1 ? w.stages.microbatches * l.accumulation : l.accumulation;
  add_allocator(w, worst, &out);
  add_step_time(w, worst, held[static_cast<size_t>(out.pp_rank)].modules, &out);
  return out;
}

}  // namespace titan::planner::detail
