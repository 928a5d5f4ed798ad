// SPDX-License-Identifier: BSD-3-Clause
// One pp rank of a Llama 3 model as the pipeline benchmarks run it: its stages of `pipeline` built after
// seeding the init (so every run draws the same weights), the model's plan with that pipeline applied
// over the pp mesh, the weights initialised, AdamW at lr 1e-4 over the rank's parameters.
#pragma once

#include <vector>

#include "titan/dist/mesh.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/parallel/planner.hpp"

namespace titan::bench {

struct PipelineRank {
  PipelineRank(const llama3::Llama3Args& args, int64_t seq_len, const parallel::PipelinePlan& pipeline,
               const dist::Mesh& mesh)
      : model(seeded(args), seq_len, at::TensorOptions(), parallel::pipeline_modules(pipeline, mesh)),
        plan(with_pipeline(parallel::plan(model.sharding_spec(), {}, mesh.shape()), pipeline)),
        applied(parallelize(model, mesh, plan)),
        params(initialised(model)),
        optimizer(params, {.lr = 1e-4}) {}

  parallel::Pipeline& pipe() { return *applied.pipeline(); }

  llama3::Llama3 model;            // this rank's stages
  parallel::ParallelPlan plan;     // plan.pipeline: the stages of every rank
  Parallelized applied;            // the pipeline runtime and the loss
  std::vector<at::Tensor> params;  // the rank's parameters, once each
  AdamW optimizer;                 // over params

 private:
  static const llama3::Llama3Args& seeded(const llama3::Llama3Args& args) {
    nn::manual_init_seed(0);
    return args;
  }
  static parallel::ParallelPlan with_pipeline(parallel::ParallelPlan plan, const parallel::PipelinePlan& pipeline) {
    plan.pipeline = pipeline;
    return plan;
  }
  static std::vector<at::Tensor> initialised(llama3::Llama3& model) {
    model.init_weights();
    return model.unique_parameters();
  }
};

}  // namespace titan::bench
