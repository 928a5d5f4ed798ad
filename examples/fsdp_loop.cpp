// SPDX-License-Identifier: BSD-3-Clause
// Your own FSDP training loop from titan's parts: mesh from the launcher's environment, the model
// sharded before init (every layout starts from the same weights), each rank reading its slice of the
// global batch, the loss normalised over the whole global batch, clipping with the global norm.
//   build/bin/titan-run --nproc-per-node 2 build/bin/fsdp_loop
//       --job.config_file configs/llama3_debugmodel_cpu.toml --training.steps 10   (one command line)
#include <titan/titan.hpp>

int main(int argc, char** argv) {
  using namespace titan;
  try {
    const JobConfig cfg = parse_args(argc, argv);
    const dist::LaunchEnv env = dist::read_launch_env();
    log::set_rank(static_cast<int>(env.rank));
    const dist::MeshShape shape = dist::mesh_shape(cfg.parallelism, env.world_size);  // dp_shard = -1: all ranks
    const dist::Mesh mesh = env.world_size == 1
                                ? dist::Mesh()
                                : dist::Mesh(shape, env.rank,
                                             dist::Store::tcp(env.master_addr, env.master_port, env.rank == 0,
                                                              env.world_size, std::chrono::seconds(300)));

    nn::manual_init_seed(static_cast<uint64_t>(cfg.debug.seed.value_or(0)));
    auto model = llama3::Llama3::build(cfg, 0, at::kCPU);
    auto fsdp = llama3::parallelize(*model, mesh).dp;  // FSDP units: embeddings, each block, norm + output
    model->init_weights();                             // each rank fills only its shards

    auto tokenizer = build_tokenizer(cfg, model->vocab_size());
    auto loader = build_dataloader(cfg, tokenizer, mesh.coordinate("dp"), mesh.size("dp"));
    const auto params = model->unique_parameters();
    AdamW optimizer(params, cfg.optimizer);

    for (int64_t step = 1; step <= cfg.training.steps; ++step) {
      const data::Batch batch = loader->next();  // this rank's slice: input, labels (B, S) int64
      at::Tensor valid = at::full({1}, static_cast<double>(count_valid_tokens(batch.labels)), at::kDouble);
      mesh.group("dp").all_reduce(valid).wait();  // tokens of the whole global batch
      optimizer.zero_grad();
      const ForwardBackwardResult fb = forward_backward([&](const at::Tensor& t) { return model->forward(t); },
                                                        {{batch.input, batch.labels}}, at::kCPU,
                                                        static_cast<int64_t>(valid.item<double>()));
      const double norm = clip_grad_norm_(params, cfg.training.max_norm, &mesh);
      optimizer.step(cfg.optimizer.lr);
      at::Tensor loss = at::full({1}, fb.loss, at::kDouble);
      mesh.group("dp").all_reduce(loss).wait();  // each rank's share of the global token mean
      log::info("step {:3d}  loss {:.5f}  grad_norm {:.4f}  ({})", step, loss.item<double>(), norm,
                fsdp ? fsdp->describe() : "one rank");
    }
    return 0;
  } catch (const std::exception& e) {
    log::error("{}", error_message(e));
    return 1;
  }
}
