// SPDX-License-Identifier: BSD-3-Clause
// Your own training loop from titan's parts: config, model + init, AdamW,
// warmup-stable-decay LR, data loader, token-mean loss, clipping, metrics. Run:
//   build/bin/custom_loop --training.steps 20 --training.seq_len 128 --training.local_batch_size 4
#include <ATen/Parallel.h>
#include <titan/titan.hpp>


int main(int argc, char** argv) {
  try {
    titan::ConfigNotes notes;
    titan::JobConfig cfg = titan::parse_args(argc, argv, &notes);
    if (notes.help_requested) return fmt::print("{}", titan::config_help()), 0;

    titan::nn::manual_init_seed(static_cast<uint64_t>(cfg.debug.seed.value_or(0)));  // layout-invariant init
    auto model = titan::llama3::Llama3::build(cfg, 0, at::kCPU);
    model->init_weights();
    auto tokenizer = titan::build_tokenizer(cfg, model->vocab_size());
    auto loader = titan::build_dataloader(cfg, tokenizer, /*dp_rank=*/0, /*dp_degree=*/1);

    const auto params = model->unique_parameters();
    titan::AdamW optimizer(params, cfg.optimizer);
    titan::LRSchedule schedule(cfg.lr_scheduler, cfg.training.steps);
    titan::MetricsProcessor metrics({.flops_per_token = model->num_flops_per_token(cfg.training.seq_len),
                                     .peak_flops = titan::peak_flops(at::kCPU, at::get_num_threads()).flops});

    for (int64_t step = 1; step <= cfg.training.steps; ++step) {
      const titan::data::Batch batch = loader->next();  // input, labels: (B, S) int64
      const at::Tensor logits = model->forward(batch.input);                                     // (B, S, V)
      const at::Tensor loss = titan::cross_entropy_sum(logits, batch.labels) /
                              static_cast<double>(titan::count_valid_tokens(batch.labels));      // ()
      optimizer.zero_grad();
      loss.backward();
      const double norm = titan::clip_grad_norm_(params, cfg.training.max_norm);
      const double lr = cfg.optimizer.lr * schedule.factor(step - 1);
      optimizer.step(lr);
      metrics.add_step(batch.labels.numel(), 0.0);
      metrics.log(step, loss.item<double>(), norm, lr);
    }
    return 0;
  } catch (const std::exception& e) {
    titan::log::error("{}", titan::error_message(e));
    return 1;
  }
}
