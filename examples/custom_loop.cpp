// SPDX-License-Identifier: BSD-3-Clause
// Your own training loop from titan's parts, on any layout the launcher and the config describe:
// mesh, model on the device, its plan applied in one call, init on the shards (every layout starts
// from the same weights), AdamW and the LR schedule from their config sections, each rank reading
// its slice of the global batch, the loss normalised over the whole global batch, global-norm clipping.
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
    const dist::Mesh mesh = dist::Mesh::from_launch_env(cfg.parallelism);
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
    const auto params = model->unique_parameters();
    AdamW optimizer(params, cfg.optimizer);
    const LRSchedule schedule(cfg.lr_scheduler, cfg.training.steps);
    MetricsProcessor metrics({.flops_per_token = model->num_flops_per_token(cfg.training.seq_len),
                              .peak_flops = peak_flops(at::kCPU, at::get_num_threads()).flops,
                              .non_data_parallel_size = mesh.size("tp") * mesh.size("pp") * mesh.size("cp")});

    for (int64_t step = 1; step <= cfg.training.steps; ++step) {
      const data::Batch batch = loader->next();  // this rank's slice: input, labels (B, S) int64
      // Under context parallelism the rank keeps its part of each sequence (else all of it), and its
      // forward takes the part's attention context (true positions, documents, the split).
      const parallel::LocalBatch local = parallel.local_batch({.tokens = batch.input,
                                                               .labels = batch.labels,
                                                               .positions = batch.positions,
                                                               .document_ids = batch.document_ids});
      at::Tensor valid = at::full({1}, static_cast<double>(count_valid_tokens(local.labels)), at::kDouble);
      mesh.group("dp_cp").all_reduce(valid).wait();  // tokens of the whole global batch
      optimizer.zero_grad();
      double local_loss = 0;  // this rank's share of the global token mean
      const LossFn loss_fn = [&](const at::Tensor& logits, const at::Tensor& labels) {
        return parallel.cross_entropy_sum(logits, labels);  // logits (B, S, V or V/tp)
      };
      if (parallel::Pipeline* pp = parallel.pipeline()) {
        // The schedule runs the microbatches through the stages; every pp rank gets the loss.
        const auto stage = [&](int64_t s, const at::Tensor& x, const nn::AttentionContext& context) {
          return model->forward_part(x, plan.pipeline.stages[s], context);
        };
        local_loss = pp->step(stage, local.tokens, local.labels, loss_fn, 1.0 / valid.item<double>(), local.attention);
      } else {
        const at::Tensor logits = model->forward(local.tokens, local.attention);       // (B, S, V or V/tp)
        const at::Tensor loss = loss_fn(logits, local.labels) / valid.item<double>();  // ()
        loss.backward();
        local_loss = loss.item<double>();
      }
      const double norm = clip_grad_norm_(params, cfg.training.max_norm, &mesh);
      const double lr = cfg.optimizer.lr * schedule.factor(step - 1);
      optimizer.step(lr);
      at::Tensor global_loss = at::full({1}, local_loss, at::kDouble);
      mesh.group("dp_cp").all_reduce(global_loss).wait();
      metrics.add_step(batch.labels.numel(), 0.0);
      metrics.log(step, global_loss.item<double>(), norm, lr);
    }
    return 0;
  } catch (const std::exception& e) {
    log::error("{}", error_message(e));
    return 1;
  }
}
