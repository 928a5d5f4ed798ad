// SPDX-License-Identifier: BSD-3-Clause
// One layout's step time (docs/memory_planner.md, "Speed"): model FLOPs at a compute efficiency calibrated
// on torchtitan's published H100 runs (memory_plan_calibration.hpp), the recompute the plan's activation
// checkpointing adds, and the communication the layout cannot hide: FSDP's all-gathers and reduce-scatters (EP's
// experts' over efsdp; HSDP's all-reduces) beyond what compute hides, TP's and CP's collectives (and the wait of
// Gated DeltaNet's state passing), EP's token all-to-alls, and the pipeline schedule's bubble.
#include <algorithm>
#include <string>

#include "memory_plan_detail.hpp"
#include "titan/models/decoder_spec.hpp"
#include "titan/parallel/pipeline_schedule.hpp"

namespace titan::planner::detail {
namespace {

// What the plan's activation checkpointing runs again, over the model's blocks.
struct Recompute {
  double flops = 0;   // the share of the blocks' forward FLOPs run again
  double blocks = 0;  // the share of the blocks checkpointed
  bool per_op = false;
};

Recompute recompute_of(const Walk& w) {
  double all = 0, again = 0;
  int64_t checkpointed = 0;
  for (const std::string& block : w.c.spec.blocks) {
    const BlockTerms& b = w.terms[static_cast<size_t>(models::ModelParts::layer_index(block))];
    const BlockAc ac = block_ac(w.plan.activation_checkpoint, block);
    all += b.flops;
    if (ac == BlockAc::none) continue;
    ++checkpointed;
    again += ac == BlockAc::full ? b.flops : b.op_recompute;
  }
  return {
      .flops = again / std::max(all, 1.0),
      .blocks = static_cast<double>(checkpointed) / static_cast<double>(std::max<size_t>(w.c.spec.blocks.size(), 1)),
      .per_op = w.plan.activation_checkpoint.per_op};
}

// Links: the mesh is laid out pp, dp_replicate, dp_shard, cp, tp from outermost to innermost, so a group stays
// inside one node while the degrees inside it multiply to at most gpus_per_node.
struct Links {
  const PlanOptions& o;
  double bandwidth(int64_t span) const {
    return span <= std::max<int64_t>(o.gpus_per_node, 1) ? o.intra_node_bw : o.inter_node_bw;
  }
};

// FSDP: all-gather every unit in forward, again in backward when resharded after forward, and reduce-scatter the
// gradients (reduce dtype); each (n-1)/n of the bytes through a GPU's link. Under PP units stay gathered and
// reduce once per step; otherwise every microbatch of gradient accumulation gathers and reduces again. Prefetch
// hides it behind compute but for the first unit's gather and the last one's reduce-scatter of each pass.
double data_parallel_seconds(const Walk& w, const RankPlan& shown, double hidden_by, const Links& links) {
  const dist::MeshShape& m = w.l.mesh;
  const int64_t shard_n = m.dp_shard * m.cp;
  if (!w.fsdp && m.dp_replicate == 1 && !(m.ep > 1 && m.efsdp() * m.dp_replicate > 1)) return 0;
  const double rounds = m.pp > 1 ? 1.0 : static_cast<double>(w.l.accumulation);
  double seconds = 0;
  if (w.fsdp) {
    const bool never = w.plan.data_parallel.options.reshard_after_forward == ReshardAfterForward::never;
    const double gathers = never ? 1.0 : 2.0;
    auto through_link = [&](int64_t gathered, int64_t reduced, int64_t n) {
      const double share = static_cast<double>(n - 1) / static_cast<double>(n);
      return (gathers * static_cast<double>(gathered) + static_cast<double>(reduced)) * share * rounds;
    };
    seconds += through_link(shown.gathered, shown.reduced, shard_n) / links.bandwidth(shard_n * m.tp);
    if (m.ep > 1 && m.efsdp() > 1)
      seconds += through_link(shown.expert_gathered, shown.expert_reduced, m.efsdp()) / links.bandwidth(shard_n * m.tp);
  }
  if (m.dp_replicate > 1) {
    // HSDP / DDP: an all-reduce of the (sharded) gradients across the replicas, 2 (r-1)/r of them.
    const double r = static_cast<double>(m.dp_replicate);
    const double grads = static_cast<double>(shown.reduced) / static_cast<double>(std::max<int64_t>(shard_n, 1));
    seconds += 2.0 * (r - 1) / r * grads * rounds / links.bandwidth(m.world_size() / m.pp);
  }
  // EP: the replicas of a rank's expert shard (dp_replicate) all-reduce its gradient.
  if (m.ep > 1 && m.dp_replicate > 1) {
    const double r = static_cast<double>(m.dp_replicate);
    seconds += 2.0 * (r - 1) / r * static_cast<double>(shown.experts * w.bytes.reduced) /
               links.bandwidth(m.world_size() / m.pp);
  }
  return std::max(0.0, seconds - hidden_by) + 2.0 * seconds / (static_cast<double>(shown.units) * rounds);
}

// CP through linear-attention (Gated DeltaNet) blocks: each block's recurrence on cp rank r starts from the state
// rank r - 1 ends it with, one message (BlockTerms::cp_message) per block, microbatch and direction. Along a run of
// such blocks the ranks form a wavefront, rank r one recurrence and one message behind rank r - 1; within the run
// each later message arrives as its recurrence is reached (the lag stays that one step), so what waits is the
// wavefront filling at the run's start: (cp - 1) x (t_rule + t_message) in forward and the same in backward, the
// direction reversed. A full-attention block drains it (its K/V exchange needs every rank), as does a stage's end,
// and microbatches run one after the other, so every run of every microbatch fills it again. t_rule is one rank's
// recurrence of the block (DecoderShape::linear_attention_flops: forward a third, backward two thirds), at the
// compute rate `seconds_per_flop`. Under full AC the recompute reuses the message it kept: no wait.
double state_passing_seconds(const Walk& w, const std::vector<std::string>& modules, double forwards,
                             double seconds_per_flop, const Links& links) {
  const dist::MeshShape& m = w.l.mesh;
  if (m.cp == 1) return 0;
  const double rule = static_cast<double>(w.c.model.shape().linear_attention_flops) *
                      static_cast<double>(w.x.tokens()) / static_cast<double>(m.tp) * seconds_per_flop;
  double seconds = 0;
  int64_t previous = -2;  // the last block seen, if it was a linear-attention one
  for (const std::string& path : modules) {
    const int64_t layer = models::ModelParts::layer_index(path);
    const int64_t message = layer >= 0 ? w.terms[static_cast<size_t>(layer)].cp_message : 0;
    if (message > 0 && layer != previous + 1)
      seconds +=
          static_cast<double>(m.cp - 1) * (rule + 2.0 * static_cast<double>(message) / links.bandwidth(m.cp * m.tp));
    previous = message > 0 ? layer : -2;
  }
  return seconds * forwards;
}

// The collectives of TP, CP and EP, on the critical path. `passes`: forward passes of a block's collectives per
// microbatch (forward, backward, and the recompute: full AC redoes them; op AC keeps the reduce-scatters' outputs
// and redoes the all-gathers); `blocks` per rank, `forwards` (microbatches) per step.
void add_collectives(const Walk& w, const std::vector<std::string>& modules, double passes, double blocks,
                     double forwards, const Links& links, StepTerms* t) {
  const double work = passes * blocks * forwards;
  const dist::MeshShape& m = w.l.mesh;
  const Shapes& x = w.x;
  // TP with sequence parallelism: per block two all-gathers and two reduce-scatters of the (T, D) activations,
  // each (t-1)/t of them through a GPU's link. Async TP splits each into t chunks that overlap the matmul over
  // the previous chunk: only the first chunk is exposed.
  if (m.tp > 1) {
    const double bytes = 4.0 * static_cast<double>(x.tokens() * x.D * x.bytes) * static_cast<double>(m.tp - 1) /
                         static_cast<double>(m.tp) * work;
    t->tp = bytes / links.bandwidth(m.tp);
    if (w.plan.tensor_parallel.async) t->tp /= static_cast<double>(m.tp);
  }
  // CP (allgather rotation): each softmax-attention block gathers the whole sequence's K and V before attention and
  // reduce-scatters their gradients in backward, blocking (a linear-attention block passes its state instead).
  if (m.cp > 1) {
    const models::DecoderShape& shape = w.c.model.shape();
    const int64_t kv = shape.n_kv_heads * shape.head_dim / m.tp;
    const double softmax = 1.0 - static_cast<double>(shape.linear_attention_layers.size()) /
                                     static_cast<double>(std::max<int64_t>(shape.n_layers, 1));
    const double bytes =
        2.0 * static_cast<double>(x.tokens() * kv * x.bytes) * static_cast<double>(m.cp - 1) * work * softmax;
    t->cp = bytes / links.bandwidth(m.cp * m.tp);
  }
  // EP: each MoE layer's forward sends its slots to their experts' ranks and brings the outputs back (two
  // all-to-alls, (ep-1)/ep of the slots leave the rank with balanced routing), its backward the same in reverse, a
  // recompute again; blocking: the experts wait for their tokens. ETP's all-gather and reduce-scatter of the
  // slots over tp are charged on the same link (ep x tp spans at least tp).
  if (m.ep > 1 || m.etp > 1) {
    double bytes = 0;
    for (const std::string& path : modules) {
      const int64_t layer = models::ModelParts::layer_index(path);
      if (layer >= 0) bytes += static_cast<double>(w.terms[static_cast<size_t>(layer)].all_to_all);
    }
    t->ep = bytes * passes * forwards / links.bandwidth(m.ep * m.tp);
  }
}

// PP: the schedule's own program simulated with a forward of 1, a backward of 2 (+1 under full AC) and each
// stage-to-stage transfer in those units; its idle fraction is the bubble.
double pipeline_seconds(const Walk& w, const StepTerms& t, const Recompute& r, double forwards, const Links& links) {
  const dist::MeshShape& m = w.l.mesh;
  const double busy = t.compute + t.recompute + t.tp + t.cp + t.ep;
  const double backward = 2.0 + r.flops;
  const auto stages_per_rank = static_cast<double>(w.stages.of_rank.front().size());
  const double forward_seconds = busy / (forwards * stages_per_rank * (1.0 + backward));
  const double transfer = static_cast<double>(w.boundary) / links.bandwidth(m.world_size() / m.pp);
  const parallel::PipelineCosts costs{.forward = 1.0,
                                      .backward = backward,
                                      .backward_input = backward / 2,
                                      .backward_weight = backward / 2,
                                      .transfer = transfer / forward_seconds};
  // Long programs (a search's thousands of microbatches) take the schedule's closed form instead: the
  // simulation's cost grows with the actions while the two agree ever more closely.
  const auto num_stages = static_cast<int64_t>(w.stages.modules.size());
  const bool simulate = w.stages.microbatches * num_stages <= 1024;
  const double bubble = simulate ? parallel::bubble_fraction(parallel::simulate_pipeline(w.stages.program, costs))
                                 : parallel::theoretical_bubble(w.plan.pipeline.schedule, m.pp, w.stages.microbatches,
                                                                num_stages / m.pp, costs);
  return busy * bubble / (1.0 - bubble);
}

}  // namespace

void add_step_time(const Walk& w, const RankPlan& shown, const std::vector<std::string>& modules, MemoryPlan* plan) {
  const Context& c = w.c;
  const dist::MeshShape& m = w.l.mesh;
  const int64_t seq_len = c.config.training.seq_len;
  const double per_token = static_cast<double>(c.model.num_flops_per_token(seq_len));
  const double tokens = static_cast<double>(w.l.local_batch * w.l.accumulation * seq_len) / (m.tp * m.cp * m.pp);
  plan->flops_per_step = per_token * tokens;
  const Recompute r = recompute_of(w);
  // The fitted factors (memory_plan_calibration.hpp) unless --mfu states it.
  const double efficiency =
      c.options.mfu > 0 ? c.options.mfu : c.calibration.compute_efficiency(c.options.gpu && w.compiled, w.float8, m.cp);
  plan->compute_efficiency = efficiency;
  if (c.options.peak_flops <= 0) return;
  StepTerms& t = plan->time;
  t.compute = plan->flops_per_step / (c.options.peak_flops * efficiency);
  t.recompute = t.compute * r.flops / 3.0;  // forward is a third of forward + backward
  const Links links{c.options};
  const double forwards = static_cast<double>(plan->microbatches);  // microbatches this rank runs per step
  const double blocks = static_cast<double>(c.model.shape().n_layers) / static_cast<double>(m.pp);
  const double passes = 2.0 + (r.per_op ? 0.5 : 1.0) * r.blocks;
  add_collectives(w, modules, passes, blocks, forwards, links, &t);
  t.cp += state_passing_seconds(w, modules, forwards, 1.0 / (c.options.peak_flops * efficiency), links);
  t.fsdp = data_parallel_seconds(w, shown, t.compute + t.recompute, links);
  if (m.pp > 1) t.pp = pipeline_seconds(w, t, r, forwards, links);
  plan->step_seconds = t.total();
  plan->tokens_per_second = tokens / plan->step_seconds;
}

}  // namespace titan::planner::detail
