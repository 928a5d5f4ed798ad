// SPDX-License-Identifier: BSD-3-Clause
// Expert parallelism (torchtitan's ExpertParallel): the routed experts of each MoE layer sharded over
// the mesh's ep axis (w1/w2/w3 and any expert biases Shard(0): rank r of ep holds experts
// [r E/ep, (r+1) E/ep)), tokens sent to the rank of their expert and brought back by two all-to-alls
// with variable splits.
//
// The ep axis borrows its ranks from dp_shard x cp (parallelism.expert_parallel_degree divides
// dp_shard * cp; the mesh unflattens dp_shard_cp into (efsdp, ep), ep fastest). One forward of an
// MoE layer on this rank:
//
//   route locally -> slots sorted by global expert -> all-to-all of the per-expert counts
//   -> all-to-all of the slots (variable splits: what each rank sends to each) -> permute the
//   received slots so each local expert's are contiguous -> experts (grouped GEMM or the loop)
//   -> inverse permutation -> all-to-all back (the reverse splits) -> combine as on one device
//
// Backward runs the same exchanges in reverse (each all-to-all's gradient is the reverse
// all-to-all), so a local expert's gradient already sums the slots of every ep rank. What is left:
// the ranks that hold the same experts (efsdp x dp_replicate) add their expert gradients
// (reduce_expert_gradients; under titan::parallelize the experts are instead FSDP-sharded again over
// efsdp, Shard(0) after ep's, gathered per layer and reduce-scattered, torchtitan's efsdp mesh), and the expert-bias
// counts are summed over the loss ranks (dp x cp) before each bias update (update_expert_bias), so the bias moves as on
// one device.
//
// Expert tensor parallelism (torchtitan's ExpertTensorParallel, parallelism.expert_tensor_parallel_degree =
// tp): each expert's hidden dim F is split over the mesh's etp axis (the tp ranks) as well, w1/w3 (E, F, D)
// Shard(1) and w2 (E, D, F) Shard(2) on etp, so a rank holds 1/(ep x etp) of the routed experts. The tp
// ranks route their own sequence shard (sequence parallel); after the ep exchange each gathers the slots
// of every tp rank for its experts (an all-gather over etp), runs its slice of the hidden dim on them and
// sends each slot's partial output back to the rank that routed it, which adds the etp parts (a
// reduce-scatter). Both are uneven all_to_all_v exchanges, so backward reverses them. torchtitan
// all-gathers the MoE's input over tp before routing instead, and each tp rank then sends the same
// slots over ep: here ep carries 1/tp of those bytes. The MoE's tokens must differ across tp (sequence
// parallel, as every titan plan trains): replicated tokens would count each expert gradient tp times.
//
// Each sharded expert weight carries its layout (global shape (E, ...), ep:Shard(0), this rank's
// offset), as TP and FSDP shards do: the layout-invariant initialiser fills a shard with the values
// one device gives those experts, clipping sums its squares over ep, and a checkpoint stores it by
// its global FQN and shape (a save at one ep degree loads at any other). Under titan::parallelize
// (ParallelPlan::expert_parallel) FSDP leaves the sharded experts alone: they are reduced here.
//
//   ExpertParallelPlan plan{.moe_modules = {"layers.0.moe", "layers.1.moe"}};
//   auto ep = titan::parallel::apply_expert_parallel(model, mesh, plan);
//   model.init_weights();  // or before apply, or a checkpoint load: each rank fills its experts
//   ... forward, backward;
//   ep.reduce_expert_gradients();   // expert weights; the rest goes through DDP/FSDP as usual
//   ep.update_expert_bias();        // before optimizer.step()
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "titan/dist/process_group.hpp"
#include "titan/parallel/expert_parallel_plan.hpp"

namespace torch::nn {
class Module;
}
namespace titan::dist {
class Mesh;
}
namespace titan::nn {
class MoE;
}

namespace titan::parallel {

/// The paths of every nn::MoE in model (named_modules order): the plan of a model whose MoE layers
/// all go expert-parallel, e.g. `ExpertParallelPlan{.moe_modules = moe_modules(model)}`.
std::vector<std::string> moe_modules(const torch::nn::Module& model);

/// "ExpertParallel(layers.0.moe, layers.1.moe)"
std::string format_as(const ExpertParallelPlan& plan);

/// The token all-to-alls of this rank's EP layers since the last reset, while timing is on
/// (ExpertParallel::time_all_to_alls): what a benchmark puts next to the step time.
struct AllToAllStats {
  /// Token exchanges run: dispatch and combine, forward and backward (4 per layer per step).
  int64_t exchanges = 0;
  /// Bytes of slots this rank sent to the other ep ranks in them (its own rows stay put).
  int64_t bytes_sent = 0;
  /// Wall time inside them, issue to completion: includes waiting for the slowest ep rank.
  double seconds = 0;
  /// Wall time of the per-expert count exchanges that precede each dispatch (forward only).
  double count_seconds = 0;
};

namespace detail {
// Shared by the copies of one ExpertParallel, its layers' dispatches and their backward nodes.
struct AllToAllTimer {
  std::atomic<bool> on{false};
  std::atomic<int64_t> exchanges{0}, bytes_sent{0}, nanoseconds{0}, count_nanoseconds{0};
};
}  // namespace detail

class ExpertParallel;
namespace detail {
/// Hands the experts' gradient reduction to data parallelism (titan::parallelize's FSDP over efsdp):
/// reduce_expert_gradients is then a no-op.
void reduce_experts_by_data_parallel(ExpertParallel& ep);
}  // namespace detail

/// Differentiable all-to-all with variable splits on dim 0: rank r gets x's rows
/// [sum(in_splits[:r]), +in_splits[r]); the result holds out_splits[s] rows from each rank s, in rank
/// order. Backward: the reverse exchange (splits swapped). Exchange the counts first so every rank's
/// in_splits[me] is my out_splits[it].
at::Tensor all_to_all_v(const at::Tensor& x, const dist::ProcessGroup& group, std::vector<int64_t> out_splits,
                        std::vector<int64_t> in_splits);

/// The expert-parallel state of one model on this rank (copies share the layers and groups).
class ExpertParallel {
 public:
  /// Nothing applied (one device): every method is a no-op.
  ExpertParallel() = default;

  /// SUM over the ranks that share the experts (efsdp, then dp_replicate) of each sharded expert
  /// weight's gradient, divided by divide_by. A no-op at ep = etp = 1 (the experts are whole and data
  /// parallelism reduces them with the other weights) and under titan::parallelize, whose FSDP over
  /// efsdp x dp_replicate reduce-scatters them. With a loss normalised by the global token count (the
  /// ranks' losses add up to one device's), divide_by = 1; with a per-rank mean loss, the dp degree.
  void reduce_expert_gradients(double divide_by = 1.0) const;
  /// Each layer's tokens_per_expert summed over the loss ranks (dp x cp, then tp for sequence
  /// parallel; one all-reduce per axis for all layers), then nn::MoE::update_expert_bias(load_balance_coeff): the bias
  /// of one device. Returns the summed counts of each layer with a bias (E) fp32, taken before they are zeroed.
  std::vector<at::Tensor> update_expert_bias() const;
  /// The MoE layers under expert parallelism, in plan order.
  const std::vector<std::shared_ptr<nn::MoE>>& layers() const { return layers_; }
  /// The sharded expert weights (w1, w2, w3 of each layer, and their biases): their local shard (E/ep, ...).
  std::vector<at::Tensor> expert_parameters() const;
  /// "EP(ep=2, efsdp=2, MoE layers: 2)", "EP(ep=2, etp=2, efsdp=1, MoE layers: 2)", or "no EP".
  std::string describe() const;
  /// The ep degree applied (1 with etp 1: the layers are only recorded).
  int64_t degree() const { return ep_; }
  /// The etp degree applied: 1 (each rank's experts whole) or tp (their hidden dim split over it).
  int64_t tensor_parallel_degree() const { return etp_; }
  /// Times the token all-to-alls of the layers (off by default; off costs one relaxed load per exchange).
  void time_all_to_alls(bool on) const { timer_->on.store(on, std::memory_order_relaxed); }
  /// What they cost since the last reset_all_to_all_stats(), while timing was on.
  AllToAllStats all_to_all_stats() const;
  void reset_all_to_all_stats() const;

 private:
  friend ExpertParallel apply_expert_parallel(torch::nn::Module&, const dist::Mesh&, const ExpertParallelPlan&);
  friend void detail::reduce_experts_by_data_parallel(ExpertParallel&);
  std::vector<std::shared_ptr<nn::MoE>> layers_{};
  int64_t ep_ = 1;
  int64_t etp_ = 1;
  int64_t efsdp_ = 1;
  bool data_parallel_experts_ = false;                 // FSDP over efsdp reduces the experts' gradients, not this
  std::vector<dist::ProcessGroup> expert_replicas_{};  // efsdp, dp_replicate: ranks holding the same experts
  std::vector<dist::ProcessGroup> loss_ranks_{};       // dp_cp, tp: ranks whose counts add up
  std::shared_ptr<detail::AllToAllTimer> timer_ = std::make_shared<detail::AllToAllTimer>();
  std::shared_ptr<void> bindings_{};  // the sharded experts' layouts, withdrawn with the last copy
};

/// Shards the routed experts of each planned MoE layer over mesh.group("ep") (keeps this rank's
/// E/ep experts of w1/w2/w3 and their biases, in place, with their layout), and with mesh.size("etp") > 1
/// their hidden dim over mesh.group("etp") too, and plugs the token dispatch into the layer. The weights may hold their
/// values already (they are kept) or be initialised afterwards (init_weights fills each shard as one device would).
/// Apply it after tensor parallelism and before data parallelism (titan::parallelize does). Throws, naming the module,
/// when a path is not an nn::MoE, ep does not divide its experts, etp does not divide their hidden dim, etp > 1 meets
/// biased experts or experts under a SequenceParallel style, or its experts are already data-parallel. Collective only
/// in what it later runs; with ep = etp = 1 it only records the layers.
ExpertParallel apply_expert_parallel(torch::nn::Module& model, const dist::Mesh& mesh, const ExpertParallelPlan& plan);

}  // namespace titan::parallel
