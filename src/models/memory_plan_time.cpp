// SPDX-License-Identifier: BSD-3-Clause
// One layout's step time (docs/memory_planner.md, "Speed"): model FLOPs at a compute efficiency calibrated
// on torchtitan's published H100 runs (memory_plan_calibration.hpp), the recompute AC adds, and the
// communication the layout cannot hide: FSDP's all-gathers and reduce-scatters (EP's experts' over efsdp;
// HSDP's all-reduces) beyond what compute hides, TP's and CP's collectives, EP's token all-to-alls, and the
// pipeline schedule's bubble.
#include <algorithm>

#include "memory_plan_detail.hpp"
#include "titan/models/decoder_spec.hpp"
#include "titan/parallel/pipeline_schedule.hpp"

namespace titan::models::detail {

void add_step_time(const Context& c, const Layout& l, const StepInputs& in, MemoryPlan* plan) {
  const JobConfig& cfg = c.config;
  const DecoderShape& shape = c.model.shape();
  const dist::MeshShape& m = l.mesh;
  const bool gpu = c.options.gpu;
  const bool compiled = in.compiled;
  const bool float8 = in.float8;
  const int64_t shard_n = m.dp_shard * m.cp;  // FSDP shards over dp_shard x cp
  const bool fsdp = shard_n > 1;
  const double per_token = static_cast<double>(c.model.num_flops_per_token(cfg.training.seq_len));
  const double tokens =
      static_cast<double>(l.local_batch * l.accumulation * cfg.training.seq_len) / (m.tp * m.cp * m.pp);
  plan->flops_per_step = per_token * tokens;
  double recompute = 1.0;  // forward is a third of fwd+bwd
  if (l.ac.mode == AcMode::full) recompute += 1.0 / 3.0;
  if (l.ac.mode == AcMode::selective && !l.ac.op) recompute += 1.0 / (3.0 * static_cast<double>(l.ac.every));
  if (l.ac.op) {
    // Every other matmul and the routed experts run again (the elementwise ops are free by comparison).
    double again = 0, all = 0;
    for (const BlockTerms& b : in.terms) {
      again += b.op_recompute;
      all += b.flops;
    }
    recompute += again / std::max(all, 1.0) / 3.0;
  }
  // The fitted factors (memory_plan_calibration.hpp) unless --mfu states it.
  const double efficiency =
      c.options.mfu > 0 ? c.options.mfu : c.calibration.compute_efficiency(gpu && compiled, float8, m.cp);
  plan->compute_efficiency = efficiency;
  if (c.options.peak_flops <= 0) return;
  StepTerms& t = plan->time;
  t.compute = plan->flops_per_step / (c.options.peak_flops * efficiency);
  t.recompute = t.compute * (recompute - 1.0);

  // Links: the mesh is laid out pp, dp_replicate, dp_shard, cp, tp from outermost to innermost, so a
  // group stays inside one node while the degrees inside it multiply to at most gpus_per_node.
  const int64_t node = std::max<int64_t>(c.options.gpus_per_node, 1);
  auto bandwidth = [&](int64_t span) { return span <= node ? c.options.intra_node_bw : c.options.inter_node_bw; };
  const double blocks = static_cast<double>(shape.n_layers) / static_cast<double>(m.pp);
  const double forwards = static_cast<double>(plan->microbatches);  // microbatches this rank runs per step
  // Forward passes of a block's collectives per microbatch: forward and backward, plus the recompute
  // (full AC redoes them; op AC keeps the reduce-scatters' outputs and redoes the all-gathers).
  double passes = 2.0;
  if (l.ac.mode == AcMode::full) passes += 1.0;
  if (l.ac.mode == AcMode::selective) passes += l.ac.op ? 0.5 : 1.0 / static_cast<double>(l.ac.every);

  // TP with sequence parallelism: per block two all-gathers and two reduce-scatters of the (T, D)
  // activations, each (t-1)/t of them through a GPU's link, on the critical path. Async TP splits each
  // into t chunks that overlap the matmul over the previous chunk: only the first chunk is exposed.
  if (m.tp > 1) {
    const double bytes = 4.0 * static_cast<double>(in.x.tokens() * in.x.D * in.x.bytes) *
                         static_cast<double>(m.tp - 1) / static_cast<double>(m.tp) * passes * blocks * forwards;
    t.tp = bytes / bandwidth(m.tp);
    if (cfg.parallelism.enable_async_tensor_parallel) t.tp /= static_cast<double>(m.tp);
  }
  // CP (allgather rotation): each block gathers the whole sequence's K and V before attention and
  // reduce-scatters their gradients in backward, blocking.
  if (m.cp > 1) {
    const int64_t kv = shape.n_kv_heads * shape.head_dim / m.tp;
    const double bytes = 2.0 * static_cast<double>(in.x.tokens() * kv * in.x.bytes) * static_cast<double>(m.cp - 1) *
                         passes * blocks * forwards;
    t.cp = bytes / bandwidth(m.cp * m.tp);
  }
  // FSDP: all-gather every unit in forward, again in backward when resharded after forward, and
  // reduce-scatter the gradients (reduce dtype); each (n-1)/n of the bytes through a GPU's link. Under
  // PP units stay gathered and reduce once per step; otherwise every microbatch of gradient
  // accumulation gathers and reduces again. Prefetch hides it behind compute but for the first unit's
  // gather and the last one's reduce-scatter of each pass.
  if (fsdp || m.dp_replicate > 1 || (m.ep > 1 && m.efsdp() * m.dp_replicate > 1)) {
    ReshardAfterForward policy = cfg.parallelism.fsdp_reshard_after_forward;
    if (m.pp > 1 && policy == ReshardAfterForward::default_) policy = ReshardAfterForward::never;
    const double rounds = m.pp > 1 ? 1.0 : static_cast<double>(l.accumulation);
    double seconds = 0;
    if (fsdp) {
      const double gathers = policy == ReshardAfterForward::never ? 1.0 : 2.0;
      auto through_link = [&](int64_t gathered, int64_t reduced, int64_t n) {
        const double share = static_cast<double>(n - 1) / static_cast<double>(n);
        return (gathers * static_cast<double>(gathered) + static_cast<double>(reduced)) * share * rounds;
      };
      seconds += through_link(in.gathered, in.reduced, shard_n) / bandwidth(shard_n * m.tp);
      if (m.ep > 1 && m.efsdp() > 1)
        seconds += through_link(in.expert_gathered, in.expert_reduced, m.efsdp()) / bandwidth(shard_n * m.tp);
    }
    if (m.dp_replicate > 1) {
      // HSDP / DDP: an all-reduce of the (sharded) gradients across the replicas, 2 (r-1)/r of them.
      const double r = static_cast<double>(m.dp_replicate);
      const double grads = static_cast<double>(in.reduced) / static_cast<double>(std::max<int64_t>(shard_n, 1));
      seconds += 2.0 * (r - 1) / r * grads * rounds / bandwidth(m.world_size() / m.pp);
    }
    // EP: the replicas of a rank's expert shard (dp_replicate) all-reduce its gradient.
    if (m.ep > 1 && m.dp_replicate > 1) {
      const double r = static_cast<double>(m.dp_replicate);
      seconds += 2.0 * (r - 1) / r * static_cast<double>(in.experts * in.r_bytes) / bandwidth(m.world_size() / m.pp);
    }
    const double hidden_by = t.compute + t.recompute;
    t.fsdp = std::max(0.0, seconds - hidden_by) + 2.0 * seconds / (static_cast<double>(in.units) * rounds);
  }
  // EP: each MoE layer's forward sends its slots to their experts' ranks and brings the outputs back
  // (two all-to-alls, (ep-1)/ep of the slots leave the rank with balanced routing), its backward the
  // same in reverse, a recompute again; blocking: the experts wait for their tokens. ETP's all-gather and
  // reduce-scatter of the slots over tp are charged on the same link (ep x tp spans at least tp).
  if (m.ep > 1 || m.etp > 1) {
    double bytes = 0;
    for (const std::string& path : in.modules) {
      const int64_t layer = ModelParts::layer_index(path);
      if (layer >= 0) bytes += static_cast<double>(in.terms[static_cast<size_t>(layer)].all_to_all);
    }
    t.ep = bytes * passes * forwards / bandwidth(m.ep * m.tp);
  }
  // PP: the schedule's own program simulated with a forward of 1, a backward of 2 (+1 under full AC)
  // and each stage-to-stage transfer in those units; its idle fraction is the bubble.
  if (m.pp > 1) {
    const double busy = t.compute + t.recompute + t.tp + t.cp + t.ep;
    const double backward = 2.0 + 3.0 * (recompute - 1.0);
    const double units = forwards * static_cast<double>(in.stages_per_rank) * (1.0 + backward);
    const double forward_seconds = busy / units;
    const double transfer = static_cast<double>(in.boundary) / bandwidth(m.world_size() / m.pp);
    parallel::PipelineCosts costs{.forward = 1.0,
                                  .backward = backward,
                                  .backward_input = backward / 2,
                                  .backward_weight = backward / 2,
                                  .transfer = transfer / forward_seconds};
    // Long programs (a search's thousands of microbatches) take the schedule's closed form instead: the
    // simulation's cost grows with the actions while the two agree ever more closely.
    const bool simulate = in.pp_microbatches * in.num_stages <= 1024;
    const double bubble = simulate ? parallel::bubble_fraction(parallel::simulate_pipeline(in.program, costs))
                                   : parallel::theoretical_bubble(cfg.parallelism.pipeline_parallel_schedule, m.pp,
                                                                  in.pp_microbatches, in.num_stages / m.pp, costs);
    t.pp = busy * bubble / (1.0 - bubble);
  }
  plan->step_seconds = t.total();
  plan->tokens_per_second = tokens / plan->step_seconds;
  return;
}

}  // namespace titan::models::detail
