// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/deepseek_v3/parallelize.hpp"

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/decoder.hpp"
#include "titan/models/deepseek_v3/model.hpp"

namespace titan::deepseek_v3 {

models::DecoderShape decoder_shape(const DeepSeekV3Args& args) {
  const bool q_lora = args.q_lora_rank > 0;
  models::DecoderShape shape{
      .n_layers = args.n_layers,
      .n_heads = args.n_heads,
      .n_kv_heads = args.n_heads,
      .head_projections = {q_lora ? "wq_b" : "wq", "wkv_b"},
      .replicated_attention = q_lora ? std::vector<std::string>{"wq_a", "q_norm", "wkv_a", "kv_norm"}
                                     : std::vector<std::string>{"wkv_a", "kv_norm"},
      .shared_experts = args.moe.num_shared_experts > 0,
      .where = "titan::deepseek_v3"};
  for (int64_t i = args.n_dense_layers; i < args.n_layers; ++i) shape.moe_layers.push_back(i);
  return shape;
}

parallel::ParallelPlan parallel_plan(const DeepSeekV3& model, const JobConfig& config, const dist::Mesh& mesh) {
  for (const char* axis : {"cp", "pp"}) {
    TITAN_CHECK_NOT_IMPLEMENTED(mesh.size(axis) == 1,
                                "[titan::deepseek_v3::parallel_plan] expected {} = 1, got {}: context and pipeline "
                                "parallelism of DeepSeek-V3 are not built (or not tested) yet. Use data, tensor and "
                                "expert parallelism (parallelism.data_parallel_shard_degree, tensor_parallel_degree, "
                                "expert_parallel_degree).",
                                axis, mesh.size(axis));
  }
  const ParallelismConfig& p = config.parallelism;
  const int64_t n_layers = model.args().n_layers;
  const models::DecoderShape shape = decoder_shape(model.args());
  parallel::ParallelPlan plan{.data_parallel = {.units = models::data_parallel_units(shape)}};
  if (mesh.size("tp") > 1) {
    plan.tensor_parallel = models::tensor_parallel_plan(shape, mesh.size("tp"), /*sequence_parallel=*/true,
                                                        /*loss_parallel=*/!p.disable_loss_parallel);
    plan.tensor_parallel.async = p.enable_async_tensor_parallel;
  }
  plan.activation_checkpoint = models::activation_checkpoint_plan(n_layers, config.activation_checkpoint,
                                                                  /*has_moe=*/true, "titan::deepseek_v3");
  plan.data_parallel.options = models::data_parallel_options(model, config, mesh);
  plan.expert_parallel = models::expert_parallel_plan(shape, mesh.size("ep"), plan.data_parallel.options.param_dtype);
  return plan;
}

parallel::ParallelPlan DeepSeekV3::parallel_plan(const JobConfig& config, const dist::Mesh& mesh) const {
  return deepseek_v3::parallel_plan(*this, config, mesh);
}

}  // namespace titan::deepseek_v3
