// SPDX-License-Identifier: BSD-3-Clause
// The memory planner's internals, shared by its files: memory_plan.cpp (the planner, its checks),
// memory_plan_search.cpp (the search over layouts), memory_plan_applied.cpp (the job's plan applied on the meta
// device and the shards it leaves), memory_plan_evaluate.cpp (one layout's parts), memory_plan_buffers.cpp (the
// communication buffers), memory_plan_activations.cpp (what each block keeps for backward), memory_plan_time.cpp
// (the step time) and memory_plan_format.cpp (tables, JSON, TOML).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "memory_plan_calibration.hpp"
#include "titan/core/config.hpp"
#include "titan/models/decoder.hpp"
#include "titan/models/decoder_spec.hpp"
#include "titan/models/memory_model.hpp"
#include "titan/parallel/pipeline_schedule.hpp"
#include "titan/parallel/plan.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/parallel/sharding_spec.hpp"
#include "titan/planner/memory_plan.hpp"

namespace titan::planner::detail {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int64_t kMiB = 1024 * 1024;

inline int64_t elem_bytes(DType d) { return d == DType::float32 ? 4 : 2; }
inline int64_t elem_bytes(at::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- What parallelize leaves (memory_plan_applied.cpp) ------------------------------------------------------

// One data-parallel unit as a rank holds it (parallel::DataParallel::units).
struct HeldUnit {
  std::string name{};           // "layers.3", "layers.3.attention_norm+...", "norm+output", "root"
  int64_t layer = -1;           // the block it belongs to, -1 for none
  bool experts = false;         // expert-parallel experts under an FSDP of their own (over efsdp): a chain apart
  bool shared_experts = false;  // holds an MoE block's shared experts
  int64_t gathered_numel = 0;   // elements its all-gathers land: its unsharded parameters (and gradients)
  int64_t float8_numel = 0;     // of those, gathered in float8 (a byte each)
  int64_t largest_numel = 0;    // its largest parameter's gathered elements
  int64_t trained_numel = 0;    // of gathered_numel, the parameters that train (all but a LoRA run's frozen base)
};

// What one pp rank holds once parallelize applied the plan, read off its parameters and its data parallelism.
struct RankShards {
  std::vector<std::string> modules{};  // its top-level modules (the whole model's without a pipeline)
  int64_t tensors = 0;                 // parameter tensors (tied ones once)
  int64_t local_numel = 0;             // elements of its parameters' local storage, FSDP's padding included
  int64_t trained_tensors = 0;         // of tensors, those that train (get gradients and optimizer state)
  int64_t trained_numel = 0;           // of local_numel, theirs
  int64_t expert_numel = 0;            // of those, the expert-parallel experts'
  int64_t deferred_numel = 0;          // unsharded gradient elements kept until the step's end (under a pipeline)
  std::vector<int64_t> nf4_numels{};   // of local_numel, each base weight held in NF4 (lora.quantize_base)
  std::vector<HeldUnit> units{};       // its data-parallel units in forward order (experts' after their block's)
};

// Everything of a plan that places or sizes a parameter: the mesh but cp (FSDP shards over dp_shard x cp, which
// is all cp does to parameters), the pipeline's stages and their placement, and the weights FSDP gathers in
// float8. The rest of a plan (activation checkpointing, microbatches, async TP, reshard policy, dtypes) moves no
// parameter: layouts that differ only there share what parallelize left.
struct ShardKey {
  std::vector<int64_t> mesh{};  // pp, dp_replicate, dp_shard x cp, tp, ep, etp
  std::vector<std::vector<std::string>> stages{};
  std::string schedule{};
  std::vector<std::string> float8{};
  std::string lora{};  // the [lora] settings of a job that converts with lora (they add and freeze parameters)
  bool operator<(const ShardKey& o) const {
    return std::tie(mesh, stages, schedule, float8, lora) < std::tie(o.mesh, o.stages, o.schedule, o.float8, o.lora);
  }
};

// The planner's model and what it has applied so far.
struct PlannerState {
  MetaBuilder build{};
  std::shared_ptr<models::Decoder> whole{};  // the whole model on the meta device
  parallel::ShardingSpec spec{};             // whole->sharding_spec(), pipeline costs at the model's seq_len
  std::map<std::string, std::shared_ptr<models::Decoder>> converted{};  // float8 settings -> whole model converted
  std::map<ShardKey, std::vector<RankShards>> applied{};                // what parallelize left, by pp rank
};

// What the planner settles once per plan() or search(): the job's settings as the planner and parallel::plan
// read them.
struct Context {
  PlannerState& state;
  const models::Decoder& model;
  const JobConfig& config;
  const PlanOptions& options;
  models::AttentionMemoryModel attention{};
  parallel::ShardingSpec spec{};         // with pipeline costs at training.seq_len under a split by FLOPs
  parallel::PlanOptions plan_options{};  // the job's parallelism and precision settings (parallel::plan_options)
  Calibration calibration{};             // the fitted constants (memory_plan_calibration.hpp)
  int64_t params = 0;                    // the whole model's parameters, a LoRA job's adapters included
  int64_t trainable_params = 0;          // of those, the ones that train
};
Context make_context(PlannerState& state, const JobConfig& config, const PlanOptions& options,
                     const Calibration& calibration = {});
// Whether model.converters holds lora: the plan's ranks then hold adapters beside frozen weights.
bool lora_converted(const JobConfig& config);
// Errors naming the key for a mesh the model or the sequence cannot take (heads, experts, seq_len, the axes the
// family lacks).
void check_layout(const models::Decoder& model, const JobConfig& cfg, const dist::MeshShape& m);
// Errors naming the flag for options out of range on `world` devices; `where` names the caller.
void check_options(const PlanOptions& o, int64_t world, const char* where);

// One layout of the job.
struct Layout {
  dist::MeshShape mesh{};
  ActivationCheckpointConfig ac{.mode = AcMode::none};
  int64_t microbatch = 1;   // sequences per forward
  int64_t local_batch = 1;  // sequences per dp rank per accumulation step
  int64_t accumulation = 1;
};
// "none", "full", "selective N" or "op"; the errors of activation_checkpoint_plan for a bad mode or option.
std::string ac_name(const ActivationCheckpointConfig& ac, const Context& c);

// The plan the Trainer would apply for layout l: parallel::plan of the spec with the job's settings, l's
// activation checkpointing and microbatch size.
parallel::ParallelPlan job_plan(const Context& c, const Layout& l);
// What parallelize leaves on each pp rank under `plan` over a mesh of `mesh`'s shape (applied once per ShardKey).
const std::vector<RankShards>& applied_shards(const Context& c, const parallel::ParallelPlan& plan,
                                              const dist::MeshShape& mesh);

MemoryPlan evaluate(const Context& c, const Layout& l);

// ---- The activation model (memory_plan_activations.cpp) -----------------------------------------------------

// How a block recomputes under the plan's activation checkpointing.
enum class BlockAc { none, full, op };
BlockAc block_ac(const parallel::ActivationCheckpointPlan& ac, const std::string& block);

// What the activation model needs of one layout.
struct Shapes : models::ActivationShapes {
  int64_t ep = 1;   // expert parallel: the routed tokens go through two all-to-alls
  int64_t etp = 1;  // expert tensor parallel (1 or tp): the experts' hidden dim split over tp, their tokens gathered
  int64_t expert_copy = 0;         // bytes per element of the compute-dtype copy of EP's experts (0: none)
  bool fused_loss = false;         // CPU's fused cross-entropy (keeps the logits + two floats per token), not under TP
  bool compiled = false;           // torch.compile of the blocks: inductor fuses the SwiGLU's elementwise ops
  bool loss_parallel = false;      // the plan's head keeps the logits vocab-sharded (GPU: DTensor's loss)
  bool sequence_parallel = false;  // the plan shards activations between blocks over tp along the sequence
  int64_t D = 0, V = 0;            // residual width; vocabulary of the logits on a rank
  // Tokens at the norms on a rank (a sequence shard under sequence parallelism).
  int64_t Tn() const { return tp > 1 && sequence_parallel ? tokens() / tp : tokens(); }
};

// One block's activations for one microbatch on one rank.
struct BlockTerms {
  int64_t full = 0;         // kept for backward without checkpointing (its input included)
  int64_t op = 0;           // kept under per-operator checkpointing
  int64_t input = 0;        // its input: all that full AC keeps
  int64_t backward = 0;     // its backward's transient on top of what it keeps: the gradients in flight
  int64_t forward = 0;      // its forward's transient on top of what it keeps (the MoE's unsorted expert output)
  int64_t dispatch = 0;     // of full: the routed tokens and the all-to-all buffers of an MoE block
  double flops = 0;         // matmul FLOPs of its forward (routed experts: the active ones)
  double op_recompute = 0;  // of those, what per-operator checkpointing runs again
  int64_t all_to_all = 0;   // bytes one forward's dispatch + combine sends over ep (both directions' sum)
  int64_t cp_message = 0;   // a linear-attention block under cp: bytes it sends the next cp rank (state + tail)
  int64_t block_activations(BlockAc ac) const { return ac == BlockAc::none ? full : ac == BlockAc::full ? input : op; }
};

BlockTerms block_terms(const models::DecoderBlock& block, const models::AttentionMemoryModel& attention,
                       const Shapes& x);
// The head (final norm, output projection, loss): what it keeps, and what the loss adds at its worst moment.
int64_t head_saved(const Shapes& x);
int64_t loss_transient(const Shapes& x);

// ---- One layout's walk (memory_plan_evaluate.cpp, memory_plan_buffers.cpp, memory_plan_time.cpp) -------------

// Bytes per element of what a layout holds.
struct Dtypes {
  int64_t param = 4;     // parameters and their gradients (training.dtype)
  int64_t gathered = 4;  // what FSDP gathers (the plan's param_dtype), parameters as-is without data parallelism
  int64_t reduced = 4;   // gradients as they are reduced (the plan's reduce_dtype)
  int64_t state = 4;     // AdamW's moments (bf16 under fused_opt_states_bf16)
  int64_t compute = 4;   // activations
};

// The pipeline's stages and which pp rank runs which (one stage of the whole model without a pipeline).
struct Stages {
  std::vector<std::vector<std::string>> modules{};  // each stage's top-level modules
  std::vector<std::vector<int64_t>> of_rank{};      // each pp rank's stages
  parallel::PipelineProgram program{};              // the schedule's program (under PP)
  int64_t microbatches = 1;                         // of one pipeline step
};

// Everything one layout's walk reads, settled once for its ranks.
struct Walk {
  const Context& c;
  const Layout& l;
  const parallel::ParallelPlan& plan;
  Dtypes bytes{};
  Shapes x{};
  std::vector<BlockTerms> terms{};  // every block's
  Stages stages{};
  bool fsdp = false;           // parameters sharded over dp_shard x cp
  bool compiled = false;       // torch.compile of the model
  bool float8 = false;         // float8 linears on GPU: the calibrated speed factor
  int64_t boundary = 0;        // bytes of a stage's output (and of the gradient sent back for it)
  int64_t max_block_unit = 0;  // the largest gathered bytes of a block's unit (AC's recompute gathers it again)
  int64_t mtp = 0;             // what the multi-token prediction depths keep, on the stage with the head
};

// Bytes a unit's all-gather lands: its float8 weights a byte an element, the rest in the gathered dtype.
inline int64_t gathered_bytes(const HeldUnit& u, const Dtypes& d) {
  return (u.gathered_numel - u.float8_numel) * d.gathered + u.float8_numel;
}

// One pp rank's figures: its parts and what the plan's other fields and the step time read of it.
struct RankPlan {
  MemoryParts parts{};
  int64_t in_flight = 1;                            // microbatches whose activations it holds at its worst moment
  int64_t per_microbatch = 0;                       // activation bytes one microbatch keeps
  int64_t expert_dispatch = 0;                      // one MoE layer's routed tokens and all-to-all buffers
  int64_t gathered = 0, reduced = 0;                // bytes FSDP gathers for its units and reduce-scatters
  int64_t expert_gathered = 0, expert_reduced = 0;  // of EP's experts over efsdp
  int64_t units = 1;                                // its data-parallel units
  int64_t experts = 0;                              // its expert-parallel expert elements
  int64_t sharded_gradients = 0;                    // of parts.gradients, the shards' .grad (live across steps)
};

// The communication buffers of one pp rank (memory_plan_buffers.cpp): FSDP's gathered units in flight and its
// collectives' flat buffers (HSDP/DDP's on GPU), and the pipeline's receive buffers.
int64_t communication_bytes(const Walk& w, int64_t rank, const RankShards& held);
// Bytes of the units gathered and reduced per step, by chain (memory_plan_buffers.cpp).
void add_unit_traffic(const Walk& w, const RankShards& held, RankPlan* out);

// Fills plan->time, compute_efficiency, flops_per_step, step_seconds and tokens_per_second for the shown rank.
void add_step_time(const Walk& w, const RankPlan& shown, const std::vector<std::string>& modules, MemoryPlan* plan);

}  // namespace titan::planner::detail
