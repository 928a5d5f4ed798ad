// SPDX-License-Identifier: BSD-3-Clause
// Private: what each ParallelStyle does to the module it names — shard (bind) its parameters over
// tp and install the hook that redistributes its input and output.
#pragma once

#include <string>
#include <vector>

#include "../layout/binding.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/layout/module_hooks.hpp"
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
};

/// What a TensorParallel owns: the plan, the hooks it installed and the parameters it bound.
struct TensorParallelState {
  struct Hook {
    std::string path;                        // the module path the plan named
    std::shared_ptr<const ModuleHook> hook;  // installed on that module
  };
  TensorParallelPlan plan;
  TpContext ctx;
  std::vector<const torch::nn::Module*> hooked;
  std::vector<Hook> hooks;
  std::vector<at::Tensor> params;
  bool loss_parallel = false;
  bool sequence_parallel = false;

  ~TensorParallelState() {
    for (const auto* m : hooked) remove_module_hook(m);
    for (const auto& p : params) unbind_param(p);
  }
};

/// Checks that style fits module (path names it in errors); degree = tp size.
void check_style(const std::string& path, const torch::nn::Module& module, const ParallelStyle& style, int64_t degree);

/// Shards module's parameters and builds its hook.
AppliedStyle apply_style(const std::string& path, torch::nn::Module& module, const ParallelStyle& style,
                         const TpContext& ctx);

}  // namespace titan::parallel::detail
