// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/llama3/parallelize.hpp"

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/decoder_plan.hpp"
#include "titan/models/llama3/model.hpp"

namespace titan::llama3 {

std::vector<std::vector<std::string>> data_parallel_units(const Llama3& model) {
  return models::data_parallel_units(model.shape());
}

parallel::TensorParallelPlan tensor_parallel_plan(const Llama3& model, int64_t degree,
                                                  const TensorParallelOptions& options) {
  return models::tensor_parallel_plan(model.shape(), degree, options.sequence_parallel, options.loss_parallel);
}

parallel::PipelinePlan pipeline_plan(const Llama3Args& args, int64_t pp, const ParallelismConfig& p, int64_t seq_len) {
  if (p.pipeline_parallel_split != PipelineSplitBy::flops || p.module_fqns_per_model_part) {
    return models::pipeline_plan(args.n_layers, pp, p);
  }
  TITAN_CHECK_VALUE(seq_len > 0,
                    "[titan::llama3] expected the training seq_len (> 0) to weigh the pipeline stages by FLOPs "
                    "(parallelism.pipeline_parallel_split = flops), got {}. Pass it to pipeline_plan.",
                    seq_len);
  const auto whole = std::make_shared<Llama3>(args, seq_len, at::TensorOptions().device(at::kMeta));  // shapes only
  return models::pipeline_plan(args.n_layers, pp, p, models::pipeline_costs(*whole, seq_len));
}

parallel::ContextParallelPlan context_parallel_plan(const Llama3Args& args, const ParallelismConfig& p) {
  return models::context_parallel_plan(args.n_layers, p);
}

parallel::ActivationCheckpointPlan activation_checkpoint_plan(const Llama3Args& args,
                                                              const ActivationCheckpointConfig& ac) {
  return models::activation_checkpoint_plan(args.n_layers, ac, /*has_moe=*/false, "titan::llama3");
}

parallel::ParallelPlan parallel_plan(const Llama3& model, const dist::Mesh& mesh) {
  parallel::ParallelPlan plan{.data_parallel = {.units = data_parallel_units(model)}};
  if (mesh.size("cp") > 1) plan.context_parallel = context_parallel_plan(model.args(), ParallelismConfig{});
  if (mesh.size("pp") > 1) plan.pipeline = pipeline_plan(model.args(), mesh.size("pp"), ParallelismConfig{});
  if (mesh.size("tp") > 1) plan.tensor_parallel = tensor_parallel_plan(model, mesh.size("tp"));
  return plan;
}

parallel::ParallelPlan parallel_plan(const Llama3& model, const JobConfig& config, const dist::Mesh& mesh) {
  return models::decoder_parallel_plan(model, config, mesh);
}

}  // namespace titan::llama3
