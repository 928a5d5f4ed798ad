// SPDX-License-Identifier: BSD-3-Clause
// Your own model, given its own tensor-parallel plan: a small residual-MLP language model built from
// titan's layers, sharded Megatron-style (vocab-parallel embedding, colwise up / rowwise down
// projections, sequence-parallel norms, loss on vocab-sharded logits) over every launched rank.
//   build/bin/tp_custom_model                                    one process
//   build/bin/titan-run --nproc-per-node 2 build/bin/tp_custom_model   TP 2: the same losses
#include <titan/titan.hpp>

using namespace titan;
using parallel::Placement;

// A block's forward runs through module_call so a plan can name the block itself (PrepareModuleInput).
struct MlpBlock : torch::nn::Module {
  MlpBlock(int64_t dim, const at::TensorOptions& o)
      : norm(register_module("norm", std::make_shared<nn::RMSNorm>(dim, 1e-5, o))),
        up(register_module("up", std::make_shared<nn::Linear>(dim, 4 * dim, o))),
        down(register_module("down", std::make_shared<nn::Linear>(4 * dim, dim, o))) {}
  at::Tensor forward(const at::Tensor& x) const {  // (B, S, D) -> (B, S, D)
    return x + parallel::module_call(*this, norm->forward(x),
                                     [&](const at::Tensor& h) { return down->forward(at::gelu(up->forward(h))); });
  }
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> up, down;  // weights (4D, D), (D, 4D)
};

struct TinyLM : torch::nn::Module {
  TinyLM(int64_t vocab, int64_t dim, int64_t n_blocks, const at::TensorOptions& o) {
    embed = register_module("embed", std::make_shared<nn::Embedding>(vocab, dim, o));
    for (int64_t i = 0; i < n_blocks; ++i)
      blocks.push_back(register_module(fmt::format("block{}", i), std::make_shared<MlpBlock>(dim, o)));
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(dim, 1e-5, o));
    head = register_module("head", std::make_shared<nn::Linear>(dim, vocab, o));
  }
  at::Tensor forward(const at::Tensor& tokens) const {  // (B, S) -> (B, S, V), or (B, S, V/tp)
    at::Tensor h = embed->forward(tokens);
    for (const auto& b : blocks) h = b->forward(h);
    return head->forward(norm->forward(h));
  }
  void init_weights() {
    // Each parameter draws by its name, so every layout (sharded or not) gets the same values.
    const nn::InitSite root = nn::InitSite::current();
    nn::normal_(embed->weight, root / "embed.weight", 0.0, 1.0);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const nn::InitSite block = root / fmt::format("block{}", i);
      blocks[i]->norm->reset_parameters();
      nn::trunc_normal_(blocks[i]->up->weight, block / "up.weight", 0.0, 0.02, -2.0, 2.0);
      nn::trunc_normal_(blocks[i]->down->weight, block / "down.weight", 0.0, 0.02, -2.0, 2.0);
    }
    norm->reset_parameters();
    nn::trunc_normal_(head->weight, root / "head.weight", 0.0, 0.02, -2.0, 2.0);
  }
  std::shared_ptr<nn::Embedding> embed;
  std::vector<std::shared_ptr<MlpBlock>> blocks;
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> head;
};

// The whole plan: activations are sequence-sharded between blocks, replicated inside them.
parallel::TensorParallelPlan plan_for(const TinyLM& model) {
  parallel::TensorParallelPlan plan;
  plan.add("embed",
           parallel::RowwiseParallel{.input_layout = Placement::replicate(), .output_layout = Placement::shard(1)});
  for (size_t i = 0; i < model.blocks.size(); ++i) {
    const std::string b = fmt::format("block{}", i);
    plan.add(b + ".norm", parallel::SequenceParallel{})
        .add(b, parallel::PrepareModuleInput{.input_layout = Placement::shard(1)})
        .add(b + ".up", parallel::ColwiseParallel{})
        .add(b + ".down", parallel::RowwiseParallel{.output_layout = Placement::shard(1)});
  }
  plan.add("norm", parallel::SequenceParallel{});
  plan.add("head", parallel::ColwiseParallel{.input_layout = Placement::shard(1), .loss_parallel = true});
  return plan;
}

int main() {
  try {
    const dist::Mesh mesh = dist::Mesh::from_launch_env({.tp = dist::read_launch_env().world_size});
    log::set_rank(static_cast<int>(mesh.rank()));
    constexpr int64_t kVocab = 256, kDim = 64, kBatch = 8, kSeq = 32;
    nn::manual_init_seed(0);
    TinyLM model(kVocab, kDim, 2, at::TensorOptions());
    const parallel::ParallelPlan plan{.tensor_parallel = plan_for(model)};
    if (mesh.rank() == 0) fmt::print("{}", plan);
    const Parallelized parallel = parallelize(model, mesh, plan);
    model.init_weights();  // after sharding: same weights on any layout
    const auto params = model.parameters();
    AdamW optimizer(params, {.lr = 3e-3, .weight_decay = 0.0});
    for (int64_t step = 1; step <= 20; ++step) {
      // Arithmetic progressions mod vocab: learnable, and the same batch on every rank.
      auto gen = at::make_generator<at::CPUGeneratorImpl>(step);
      const at::Tensor start = at::randint(kVocab, {kBatch, 1}, gen, at::kLong);               // (B, 1)
      const at::Tensor seq = (start + 3 * at::arange(kSeq + 1, at::kLong)).remainder(kVocab);  // (B, S+1)
      const at::Tensor input = seq.narrow(1, 0, kSeq), labels = seq.narrow(1, 1, kSeq);        // (B, S)
      const at::Tensor logits = model.forward(input);                                          // (B, S, V/tp)
      const at::Tensor loss = parallel.cross_entropy_sum(logits, labels) / static_cast<double>(labels.numel());
      optimizer.zero_grad();
      loss.backward();
      const double norm = clip_grad_norm_(params, 1.0, &mesh);
      optimizer.step(3e-3);
      log::info("step {:2d}  loss {:.6f}  grad_norm {:.4f}  ({})", step, loss.item<double>(), norm,
                parallel.describe());
    }
    return 0;
  } catch (const std::exception& e) {
    log::error("{}", error_message(e));
    return 1;
  }
}
