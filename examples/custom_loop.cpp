// SPDX-License-Identifier: BSD-3-Clause
// Your own training loop from titan's parts, on any layout the launcher and the config describe:
// mesh, model on the device, its plan applied in one call, init on the shards (every layout starts
// from the same weights), AdamW and the LR schedule from their config sections, each rank reading
// its slice of the global batch, the loss normalised over the whole global batch, global-norm clipping.
//   build/bin/custom_loop --job.config_file configs/llama3_debugmodel_cpu.toml --training.steps 10
//   build/bin/titan-run --nproc-per-node 2 build/bin/custom_loop --job.config_file configs/llama3_debugmodel_cpu.toml
//       --training.steps 10 --parallelism.tensor_parallel_degree 2         (one command line; FSDP without it)
#include <ATen/Parallel.h>
#include <titan/titan.hpp>

int main(int argc, char** argv) {
  using namespace titan;
  try {
    const JobConfig cfg = parse_args(argc, argv);
    const dist::Mesh mesh = dist::Mesh::from_launch_env(cfg.parallelism);
    log::set_rank(static_cast<int>(mesh.rank()));

    nn::manual_init_seed(static_cast<uint64_t>(cfg.debug.seed.value_or(0)));  // layout-invariant init
    auto model = llama3::Llama3::build(cfg, 0, at::kCPU);
    const Parallelized parallel = parallelize(*model, mesh, model->parallel_plan(cfg, mesh));
    model->init_weights();  // each rank fills only its shards

    auto tokenizer = build_tokenizer(cfg, model->vocab_size());
    auto loader = build_dataloader(cfg, tokenizer, mesh.coordinate("dp"), mesh.size("dp"));
    const auto params = model->unique_parameters();
    AdamW optimizer(params, cfg.optimizer);
    const LRSchedule schedule(cfg.lr_scheduler, cfg.training.steps);
    MetricsProcessor metrics({.flops_per_token = model->num_flops_per_token(cfg.training.seq_len),
                              .peak_flops = peak_flops(at::kCPU, at::get_num_threads()).flops,
                              .non_data_parallel_size = mesh.size("tp")});

    for (int64_t step = 1; step <= cfg.training.steps; ++step) {
      const data::Batch batch = loader->next();  // this rank's slice: input, labels (B, S) int64
      at::Tensor valid = at::full({1}, static_cast<double>(count_valid_tokens(batch.labels)), at::kDouble);
      mesh.group("dp").all_reduce(valid).wait();  // tokens of the whole global batch
      optimizer.zero_grad();
      const at::Tensor logits = model->forward(batch.input);  // (B, S, V or V/tp)
      const at::Tensor loss = parallel.cross_entropy_sum(logits, batch.labels) / valid.item<double>();  // ()
      loss.backward();
      const double norm = clip_grad_norm_(params, cfg.training.max_norm, &mesh);
      const double lr = cfg.optimizer.lr * schedule.factor(step - 1);
      optimizer.step(lr);
      at::Tensor global_loss = loss.detach().to(at::kDouble).reshape({1});
      mesh.group("dp").all_reduce(global_loss).wait();  // each rank's share of the global token mean
      metrics.add_step(batch.labels.numel(), 0.0);
      metrics.log(step, global_loss.item<double>(), norm, lr);
    }
    return 0;
  } catch (const std::exception& e) {
    log::error("{}", error_message(e));
    return 1;
  }
}
