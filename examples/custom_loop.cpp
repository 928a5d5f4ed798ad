// SPDX-License-Identifier: BSD-3-Clause
// Your own training loop from titan's public components, with every feature the Trainer has that changes what is
// trained: any registered family (model.name), any layout the launcher and the config describe (FSDP, TP, PP, CP,
// EP), checkpoints with exact resume, validation, MoE balancing, preemption; CPU or GPU. It makes the Trainer's
// calls in the Trainer's order, so it gives the Trainer's losses and grad norms bit for bit (a test checks).
//   build/bin/custom_loop --job.config_file configs/llama3_debugmodel_cpu.toml --training.steps 10
//   build/bin/titan-run --nproc-per-node 2 build/bin/custom_loop --job.config_file configs/llama3_debugmodel_cpu.toml
//       --training.steps 10 --parallelism.tensor_parallel_degree 2   (one command line; FSDP without the last key;
//       --model.name qwen3 --model.flavor debugmodel_moe --parallelism.expert_parallel_degree 2 for MoE)
#include <titan/titan.hpp>

int main(int argc, char** argv) {
  using namespace titan;
  try {
    // Config, mesh, device, the seed every rank shares, the run folder.
    const RunContext run(parse_args(argc, argv));
    const JobConfig& cfg = run.config();
    // The model this rank trains: planned once from its sharding spec, built (under PP its stages), parallelized,
    // initialised shard by shard.
    const RankModel<models::Decoder> model(run, models::decoder_args(cfg));
    const auto tokenizer = build_tokenizer(run, model->vocab_size());
    const auto loader = build_dataloader(cfg, tokenizer, run.dp_rank(), run.dp_degree());
    // optimizer.name: AdamW (or Adam), or Muon for the hidden matrices with AdamW for the embeddings and the head.
    const std::unique_ptr<Optimizer> optimizer =
        build_optimizer(model.parameters(), cfg.optimizer, model.parameter_names(),
                        {.mesh = &run.mesh(), .adamw_modules = model.embedding_and_head_modules()});
    const LRSchedule schedule(cfg.lr_scheduler, cfg.training.steps);
    const MoeBalancing moe(run, model.model(), model.parallel());  // a no-op for a dense model
    // Everything a checkpoint holds; a resumed run continues at state.step + 1.
    TrainingState state({.parameters = model.parameters(),
                         .names = model.parameter_names(),
                         .optimizer = optimizer.get(),
                         .loader = loader.get(),
                         .expert_biases = moe.expert_biases(),
                         .mesh = &run.mesh(),
                         .run_state = run.run_state()});
    MetricsProcessor metrics = training_metrics(run, model.counts());
    Checkpointing checkpoints(run, model->hf_adapter());
    checkpoints.load(state);
    std::optional<Validation> validation;
    if (cfg.validation.enable) validation.emplace(run, tokenizer);
    const Preemption preemption(run);

    for (int stop = 0; state.step < cfg.training.steps && stop == 0;) {
      const int64_t step = state.step + 1;
      optimizer->zero_grad();
      // This rank's slices of the global batch (under CP its part of each sequence) and the valid tokens of the
      // whole global batch, which every loss is divided by; then the pipeline schedule under PP, else forward and
      // backward. The loss comes back summed over dp and cp.
      const StepBatch batch = pull_microbatches(*loader, model.parallel(), run.mesh(), run.grad_accum_steps());
      const ForwardBackwardResult fb = forward_backward(model.parallel(), model.step_model(), batch, run.mesh(),
                                                        run.device(), model.bf16_autocast());
      state.step = step;
      const std::vector<at::Tensor> loads = moe.balance();  // expert biases, before the weights move
      const double lr = cfg.optimizer.lr * schedule.factor(step - 1);
      const double grad_norm = optimizer_step(*optimizer, lr, cfg.training.max_norm, run.mesh());  // clip, step
      metrics.add_step(fb.tokens, batch.load_seconds);
      if (is_log_step(cfg, step)) {
        if (const double ratio = moe.max_load_ratio(loads); ratio > 0) metrics.add_scalar("moe/max_load_ratio", ratio);
        metrics.log(step, fb.loss, grad_norm, lr);
      }
      if (validation && validation->due(step)) {
        const ValidationResult r = validation->run(model.step_model(), model.parallel());
        if (r.tokens > 0) metrics.log_validation(step, r.loss(), r.tokens);
      }
      stop = preemption.stop_signal();  // every rank agrees to stop after this step, with a checkpoint
      checkpoints.maybe_save(state, stop != 0);
    }
    checkpoints.wait();
    return 0;
  } catch (const std::exception& e) {
    log::error("{}", error_message(e));
    return 1;
  }
}
