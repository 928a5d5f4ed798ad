// SPDX-License-Identifier: BSD-3-Clause
// Your own training loop from titan's parts, on any layout the launcher and the config describe:
// mesh, model on the device, its plan applied in one call, init on the shards (every layout starts
// from the same weights), AdamW and the LR schedule from their config sections, then each step from the
// parts the Trainer runs too (train/step.hpp): pull_microbatches, forward_backward, optimizer_step.
//   build/bin/custom_loop --job.config_file configs/llama3_debugmodel_cpu.toml --training.steps 10
//   build/bin/titan-run --nproc-per-node 2 build/bin/custom_loop --job.config_file configs/llama3_debugmodel_cpu.toml
//       --training.steps 10 --parallelism.tensor_parallel_degree 2         (one command line; FSDP without it;
//       --parallelism.pipeline_parallel_degree 2 for a two-stage pipeline,
//       --parallelism.context_parallel_degree 2 to split each sequence over the 2 ranks)
#include <ATen/Parallel.h>
#include <titan/titan.hpp>

int main(int argc, char** argv) {
  using namespace titan;
  try {
    const JobConfig cfg = parse_args(argc, argv);
    // comm.backend: auto is Gloo on this CPU loop; strict checks NCCL's rules on it.
    const dist::Mesh mesh = dist::Mesh::from_launch_env(
        cfg.parallelism, {.backend = cfg.comm.backend == "auto" ? std::string("gloo") : cfg.comm.backend});
    log::set_rank(static_cast<int>(mesh.rank()));

    nn::manual_init_seed(static_cast<uint64_t>(cfg.debug.seed.value_or(0)));  // layout-invariant init
    // Under pipeline parallelism a rank builds only its stages' modules (the plan says which).
    const parallel::PipelinePlan pipeline =
        llama3::pipeline_plan(llama3::flavor(cfg.model.flavor), mesh.size("pp"), cfg.parallelism);
    auto model = llama3::Llama3::build(
        cfg, 0, at::kCPU,
        mesh.size("pp") > 1 ? parallel::pipeline_modules(pipeline, mesh) : std::vector<std::string>{});
    const parallel::ParallelPlan plan = model->parallel_plan(cfg, mesh);
    const Parallelized parallel = parallelize(*model, mesh, plan);
    model->init_weights();  // each rank fills only its shards

    auto tokenizer = build_tokenizer(cfg, model->vocab_size());
    auto loader = build_dataloader(cfg, tokenizer, mesh.coordinate("dp"), mesh.size("dp"));
    const int64_t microbatches = gradient_accumulation_steps(cfg, mesh.size("dp"));
    AdamW optimizer(model->unique_parameters(), cfg.optimizer);
    const LRSchedule schedule(cfg.lr_scheduler, cfg.training.steps);
    MetricsProcessor metrics({.flops_per_token = model->num_flops_per_token(cfg.training.seq_len),
                              .peak_flops = peak_flops(at::kCPU, at::get_num_threads()).flops,
                              .non_data_parallel_size = mesh.size("tp") * mesh.size("pp") * mesh.size("cp")});
    // The whole model, or under PP the stages this rank holds: the step runs whichever the layout needs.
    const StepModel step_model{
        .forward =
            [&](const at::Tensor& tokens, const nn::AttentionContext& context) {
              return model->forward(tokens, context);  // logits (B, S, V), or (B, S, V/tp) under loss parallel
            },
        .stage_forward =
            [&](int64_t stage, const at::Tensor& x, const nn::AttentionContext& context) {
              return model->forward_part(x, plan.pipeline.stages[static_cast<size_t>(stage)], context);
            }};

    for (int64_t step = 1; step <= cfg.training.steps; ++step) {
      // This rank's slices of the global batch (under CP its part of each sequence, with the attention context
      // its forward needs) and the valid tokens of the whole global batch, which every loss is divided by.
      const StepBatch batch = pull_microbatches(*loader, parallel, mesh, microbatches);
      optimizer.zero_grad();
      // The pipeline schedule under PP, else forward + backward; the loss comes back summed over dp and cp.
      const ForwardBackwardResult fb = forward_backward(parallel, step_model, batch, mesh, at::kCPU);
      const double lr = cfg.optimizer.lr * schedule.factor(step - 1);
      const double grad_norm = optimizer_step(optimizer, lr, cfg.training.max_norm, mesh);  // clip, then AdamW
      metrics.add_step(fb.tokens, batch.load_seconds);
      metrics.log(step, fb.loss, grad_norm, lr);
    }
    return 0;
  } catch (const std::exception& e) {
    log::error("{}", error_message(e));
    return 1;
  }
}
