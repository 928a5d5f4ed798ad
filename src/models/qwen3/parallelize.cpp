// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/qwen3/parallelize.hpp"

#include "titan/core/config.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/qwen3/model.hpp"

namespace titan::qwen3 {

models::DecoderShape decoder_shape(const Qwen3Args& args) {
  models::DecoderShape shape{
      .n_layers = args.n_layers,
      .n_heads = args.n_heads,
      .n_kv_heads = args.n_kv_heads,
      .tied = args.tie_word_embeddings,
      .replicated_attention = args.qk_norm ? std::vector<std::string>{"q_norm", "k_norm"} : std::vector<std::string>{},
      .shared_experts = args.moe.num_shared_experts > 0,
      .where = "titan::qwen3"};
  for (int64_t i = 0; i < args.n_layers; ++i) {
    if (args.is_moe_layer(i)) shape.moe_layers.push_back(i);
  }
  return shape;
}

parallel::ParallelPlan parallel_plan(const Qwen3& model, const JobConfig& config, const dist::Mesh& mesh) {
  const ParallelismConfig& p = config.parallelism;
  const Qwen3Args& args = model.args();
  const models::DecoderShape shape = decoder_shape(args);
  parallel::ParallelPlan plan{.data_parallel = {.units = models::data_parallel_units(shape)}};
  if (mesh.size("tp") > 1) {
    plan.tensor_parallel = models::tensor_parallel_plan(shape, mesh.size("tp"), /*sequence_parallel=*/true,
                                                        /*loss_parallel=*/!p.disable_loss_parallel);
    plan.tensor_parallel.async = p.enable_async_tensor_parallel;
  }
  if (mesh.size("pp") > 1) plan.pipeline = models::pipeline_plan(args.n_layers, mesh.size("pp"), p);
  if (mesh.size("cp") > 1) plan.context_parallel = models::context_parallel_plan(args.n_layers, p);
  plan.activation_checkpoint = models::activation_checkpoint_plan(args.n_layers, config.activation_checkpoint,
                                                                  !shape.moe_layers.empty(), "titan::qwen3");
  plan.data_parallel.options = models::data_parallel_options(model, config, mesh);
  plan.expert_parallel = models::expert_parallel_plan(shape, mesh.size("ep"), plan.data_parallel.options.param_dtype);
  return plan;
}

parallel::ParallelPlan Qwen3::parallel_plan(const JobConfig& config, const dist::Mesh& mesh) const {
  return qwen3::parallel_plan(*this, config, mesh);
}

}  // namespace titan::qwen3
