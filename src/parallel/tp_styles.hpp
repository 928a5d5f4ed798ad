// SPDX-License-Identifier: BSD-3-Clause
// Private: what each ParallelStyle does to the module it names — shard (bind) its parameters over
// tp and install the hook that redistributes its input and output.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../layout/binding.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/layout/module_hooks.hpp"
#include "titan/layout/shardable.hpp"
#include "titan/parallel/plan.hpp"
#include "titan/parallel/tensor_parallel.hpp"

namespace titan::parallel::detail {

struct TpContext {
  std::string axis;                                             // mesh axis name, recorded in the ShardedParams
  dist::ProcessGroup group = dist::ProcessGroup::single("tp");  // the tp group
  bool async = false;                                           // pipeline sequence collectives over batch chunks
  int64_t chunks = 2;                                           // batch chunks (async)
  std::shared_ptr<std::vector<TensorParallelEvent>> trace;      // null: not recorded
};

/// What applying one style produced.
struct AppliedStyle {
  std::shared_ptr<const ModuleHook> hook;  // null: nothing around the forward
  std::vector<at::Tensor> params;          // parameters it bound (unbound on teardown)
  bool loss_parallel = false;              // the module's output is the vocab-sharded logits
  /// The sharded layer, whose tp_group the style set (cleared on teardown if it still lives).
  std::pair<std::weak_ptr<const torch::nn::Module>, ShardableLayer*> layer{};
};

/// What a TensorParallel owns: the plan, the hooks it installed and the parameters it bound.
struct TensorParallelState {
  struct Hook {
    std::string path;                        // the module path the plan named
    const torch::nn::Module* module;         // that module (the index's key)
    std::shared_ptr<const ModuleHook> hook;  // installed on that module
  };
  TensorParallelPlan plan;
  TpContext ctx;
  std::vector<Hook> hooks;
  std::vector<std::pair<std::weak_ptr<const torch::nn::Module>, ShardableLayer*>> layers;  // their tp_group set
  std::vector<at::Tensor> params;
  bool loss_parallel = false;
  bool sequence_parallel = false;

  ~TensorParallelState() {
    for (const Hook& h : hooks) remove_module_hook(h.module, h.hook.get());
    for (const auto& [owner, layer] : layers) {
      if (owner.expired()) continue;
      layer->tp_group = nullptr;
      layer->bias_after_reduction = false;
    }
    for (const auto& p : params) unbind_param(p);
  }
};

/// Checks that style fits module (path names it in errors); degree = tp size. `vocab_sharded` holds the weights the
/// plan's earlier entries split by vocabulary (RowwiseParallel embeddings): a tied head's must be one of them; this
/// entry's embedding weight is added.
void check_style(const std::string& path, const torch::nn::Module& module, const ParallelStyle& style, int64_t degree,
                 std::vector<const c10::TensorImpl*>& vocab_sharded);

/// Whether a PrepareModuleInput (to a replicated input) names an ancestor of path. Such a module's input, and every
/// replicated activation its forward derives from it (MLA's kv_norm output feeding wkv_b), has its gradient summed
/// over tp once, at the module's input: a colwise layer inside must not add its own sum (DTensor's "input is already
/// a DTensor"). Backward is linear in the incoming gradient, so each rank's share flows back to that input, while the
/// replicated weights on the way sum theirs (SequenceParallel). Decided from the plan, not from the call stack.
bool prepared_by_ancestor(const TensorParallelPlan& plan, const std::string& path);

/// Shards module's parameters and builds its hook; `prepared`: prepared_by_ancestor(plan, path).
AppliedStyle apply_style(const std::string& path, torch::nn::Module& module, const ParallelStyle& style,
                         const TpContext& ctx, bool prepared);

}  // namespace titan::parallel::detail
