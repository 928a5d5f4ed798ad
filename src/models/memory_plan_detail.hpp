// SPDX-License-Identifier: BSD-3-Clause
// The memory planner's internals, shared by its files: memory_plan.cpp (entry points, checks, search),
// memory_plan_evaluate.cpp (one layout's parts), memory_plan_time.cpp (its step time),
// memory_plan_activations.cpp (what each block keeps for backward) and memory_plan_format.cpp (tables,
// JSON, TOML).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "memory_plan_calibration.hpp"
#include "titan/core/config.hpp"
#include "titan/models/decoder.hpp"
#include "titan/models/memory_model.hpp"
#include "titan/models/memory_plan.hpp"
#include "titan/parallel/pipeline_schedule.hpp"

namespace titan::models::detail {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int64_t kMiB = 1024 * 1024;

inline int64_t elem_bytes(DType d) { return d == DType::float32 ? 4 : 2; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One parameter as the plan shards it: TP splits dim 0 (colwise, vocab-parallel) or dim 1 (rowwise);
// a routed expert's stacked weight is split over ep on dim 0 and then again over efsdp by a unit of its own.
struct ParamShape {
  std::string name;
  std::string module;  // top-level module path: tok_embeddings, layers.N, norm, output
  int64_t unit = 0;    // its data-parallel unit (models::data_parallel_units)
  int64_t rows = 0;    // dim 0
  int64_t row_numel = 1;
  int tp_dim = -1;      // -1: replicated over tp
  bool expert = false;  // layers.N.moe.experts.*: (E, ...) stacked
};

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
AcPolicy ac_policy(const ActivationCheckpointConfig& ac, const DecoderShape& shape);

// What the activation model needs of one layout.
struct Shapes : ActivationShapes {
  int64_t ep = 1;   // expert parallel: the routed tokens go through two all-to-alls
  int64_t etp = 1;  // expert tensor parallel (1 or tp): the experts' hidden dim split over tp, their tokens gathered
  int64_t expert_copy =
      0;  // bytes per element of the compute-dtype copy of EP's experts (0: none, they are read as kept)
  bool fused_loss = false;     // CPU's fused cross-entropy (keeps the logits + two floats per token), not under TP
  bool compiled = false;       // torch.compile of the blocks: inductor fuses the SwiGLU's elementwise ops
  bool loss_parallel = false;  // GPU, TP > 1 and parallelism.disable_loss_parallel false
  int64_t D = 0, V = 0;        // residual width; vocabulary per tp rank
  int64_t Tn() const { return tp > 1 ? tokens() / tp : tokens(); }  // tokens at the norms (sequence parallel)
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
  int64_t block_activations(BlockAc ac) const { return ac == BlockAc::none ? full : ac == BlockAc::full ? input : op; }
};

BlockTerms block_terms(const DecoderBlock& block, const AttentionMemoryModel& attention, const Shapes& x);
// The head (final norm, output projection, loss): what it keeps, and what the loss adds at its worst moment.
int64_t head_saved(const Shapes& x);
int64_t loss_transient(const Shapes& x);

struct Context {
  const Decoder& model;
  const JobConfig& config;
  const PlanOptions& options;
  AttentionMemoryModel attention;
  std::vector<ParamShape> params;
  std::vector<std::vector<std::string>> units;
  Calibration calibration;  // the fitted constants (memory_plan_calibration.hpp)
};
Context make_context(const Decoder& model, const JobConfig& config, const PlanOptions& options,
                     const Calibration& calibration = {});

struct Layout {
  dist::MeshShape mesh{};
  AcPolicy ac{};
  int64_t microbatch = 1;   // sequences per forward
  int64_t local_batch = 1;  // sequences per dp rank per accumulation step
  int64_t accumulation = 1;
};

MemoryPlan evaluate(const Context& c, const Layout& l);

// What the step-time model takes from one layout's memory walk (the shown pp rank's figures).
struct StepInputs {
  const Shapes& x;
  const std::vector<BlockTerms>& terms;      // every block's
  const std::set<std::string>& modules;      // the shown rank's top-level modules
  const parallel::PipelineProgram& program;  // under PP
  int64_t stages_per_rank = 1;               // stages on each pp rank
  int64_t num_stages = 1;                    // stages in all
  int64_t pp_microbatches = 1;               // microbatches of one pipeline step
  int64_t boundary = 0;                      // bytes of a stage's output (and its gradient)
  int64_t gathered = 0;                      // bytes FSDP gathers for the rank's units
  int64_t reduced = 0;                       // bytes its reduce-scatters take in
  int64_t expert_gathered = 0;               // EP's experts: bytes gathered over efsdp
  int64_t expert_reduced = 0;                // and reduce-scattered over efsdp
  int64_t units = 1;                         // its FSDP units
  int64_t experts = 0;                       // its EP-sharded expert elements
  int64_t r_bytes = 4;                       // bytes of a reduced gradient element
  bool compiled = false;                     // torch.compile of the blocks
  bool float8 = false;                       // float8 linears
};
// Fills plan->time, compute_efficiency, flops_per_step, step_seconds and tokens_per_second.
void add_step_time(const Context& c, const Layout& l, const StepInputs& in, MemoryPlan* plan);

}  // namespace titan::models::detail
