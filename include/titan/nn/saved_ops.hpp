// SPDX-License-Identifier: BSD-3-Clause
// Per-operator activation checkpointing (torchtitan's "op" selective AC): a checkpointed module's
// forward keeps the outputs of its expensive ops — every other matmul, and attention — and its
// recompute in backward takes them back instead of running those ops again; the cheap element-wise
// ops in between are recomputed. C++ autograd has no saved-tensor hooks or dispatch modes, so the
// ops that can be kept are the ones titan's layers compute through: nn::linear (every nn::Linear) and
// nn::causal_attention on one device. A kept op's recompute rebuilds its autograd node over the
// recomputed inputs with the kept output, so its backward runs the kernels the plain op's would.
//
// The activation checkpoint (parallel/activation_checkpoint.hpp) opens the scopes; a model only has
// to compute through these ops to benefit.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

namespace torch::nn {
class Module;
}

namespace titan::nn {

/// What a per-operator checkpoint keeps: attention's output, and the output of the 1st, 3rd, 5th ...
/// matmul of the module's forward (torchtitan's count, restarted per checkpointed module).
struct SavedOpPolicy {
  /// Linear modules whose matmul is always recomputed and not counted (e.g. a MoE router's gate).
  std::unordered_set<const torch::nn::Module*> force_recompute{};
};

/// The outputs one checkpointed forward kept, in the order its ops ran.
class SavedOps {
 public:
  struct Entry {
    std::string op{};                 ///< "matmul" or "attention": the replay checks it meets the same op
    std::vector<at::Tensor> kept{};   ///< the op's outputs; empty when the op is recomputed
    std::vector<int64_t> versions{};  ///< the outputs' versions when kept: an in-place change is an error
  };

  explicit SavedOps(std::shared_ptr<const SavedOpPolicy> policy);
  const SavedOpPolicy& policy() const { return *policy_; }
  /// Bytes held by the kept outputs.
  int64_t kept_bytes() const;

  std::vector<Entry> entries{};  ///< appended by the forward, read in order by the recompute
  size_t cursor = 0;             ///< the recompute's next entry
  int64_t matmuls = 0;           ///< matmuls counted so far by the forward

 private:
  std::shared_ptr<const SavedOpPolicy> policy_;
};

/// While alive, the ops this thread runs record their outputs into `ops` (the checkpointed forward)
/// or take them back from it (the recompute), then the previous scope (if any) is restored.
class SavedOpsScope {
 public:
  enum class Phase : uint8_t { record, replay };
  SavedOpsScope(SavedOps& ops, Phase phase);
  ~SavedOpsScope();
  SavedOpsScope(const SavedOpsScope&) = delete;
  SavedOpsScope& operator=(const SavedOpsScope&) = delete;

 private:
  SavedOps* previous_ops_;
  Phase previous_phase_;
};

/// y = x W^T (x (..., in), w (out, in)), kept or recomputed under a per-operator checkpoint; `module`
/// (the Linear computing it) is matched against the policy's force-recompute set.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const torch::nn::Module* module = nullptr);

namespace detail {
/// The running scope's ops and phase; ops is null outside any.
struct ActiveOps {
  SavedOps* ops = nullptr;
  SavedOpsScope::Phase phase = SavedOpsScope::Phase::record;
};
ActiveOps active_ops();
/// Replay: the next entry, checked to be `op`'s (a forward that took another path is an error).
SavedOps::Entry& next_entry(SavedOps& ops, const char* op);
/// Record: appends `op`'s outputs (kept when non-empty).
void record_entry(SavedOps& ops, const char* op, std::vector<at::Tensor> kept);
}  // namespace detail

}  // namespace titan::nn
