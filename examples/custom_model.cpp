// SPDX-License-Identifier: BSD-3-Clause
// Your own model in titan's Trainer: a GPT-J-style decoder (attention and a GELU MLP side by side on one
// norm), none of the bundled families. It is only a model: built from its own arguments, it declares how it may
// be sharded (FSDP units, Megatron's tensor-parallel roles) and never reads the job config; Trainer<ParallelLM>
// trains it with everything the bundled models get: data, checkpoints, metrics, any layout.
//   build/bin/custom_model --training.steps 20
//   build/bin/titan-run --nproc-per-node 4 build/bin/custom_model \
//       --parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2
#include <titan/titan.hpp>

using namespace titan;

namespace {

constexpr int64_t kDim = 128, kHeads = 4, kBlocks = 4, kDefaultVocab = 2048;

// x + attention(norm(x)) + mlp(norm(x)).
struct Block : torch::nn::Module {
  explicit Block(const at::TensorOptions& o)
      : norm(register_module("norm", std::make_shared<nn::RMSNorm>(kDim, 1e-5, o))),
        attention(register_module("attention", std::make_shared<nn::Attention>(kDim, kHeads, kHeads, o))),
        up(register_module("up", std::make_shared<nn::Linear>(kDim, 4 * kDim, o))),
        down(register_module("down", std::make_shared<nn::Linear>(4 * kDim, kDim, o))) {}
  at::Tensor forward(const at::Tensor& x, const nn::RopeTables& rope, const nn::AttentionContext& context) const {
    const at::Tensor h = norm->forward(x);                                                      // (B, S, D)
    return x + attention->forward(h, rope, context) + down->forward(at::gelu(up->forward(h)));  // (B, S, D)
  }
  std::shared_ptr<nn::RMSNorm> norm;         // weight (D)
  std::shared_ptr<nn::Attention> attention;  // wq, wk, wv (D, D), wo (D, D)
  std::shared_ptr<nn::Linear> up, down;      // weights (4D, D), (D, 4D)
};

/// The model's own arguments.
struct ParallelLMArgs {
  /// Rows of the embedding and of the head.
  int64_t vocab_size = kDefaultVocab;
  /// Longest sequence (RoPE tables).
  int64_t max_seq_len = 256;
};

class ParallelLM : public torch::nn::Module {
 public:
  using Args = ParallelLMArgs;
  ParallelLM(const Args& args, const at::TensorOptions& o) : vocab_(args.vocab_size) {
    embed = register_module("embed", std::make_shared<nn::Embedding>(vocab_, kDim, o));
    auto container = register_module("blocks", std::make_shared<torch::nn::Module>());
    for (int64_t i = 0; i < kBlocks; ++i)
      blocks.push_back(container->register_module(std::to_string(i), std::make_shared<Block>(o)));
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(kDim, 1e-5, o));
    head = register_module("head", std::make_shared<nn::Linear>(kDim, vocab_, o));
    if (o.device().type() != at::kMeta)
      rope_ = nn::make_rope_tables({.head_dim = kDim / kHeads, .max_positions = args.max_seq_len}, o.device());
  }

  // What Trainer<ParallelLM> calls (the TrainableModel concept).
  static std::shared_ptr<ParallelLM> build(const Args& args, const ModelBuild& where) {
    TITAN_CHECK_NOT_IMPLEMENTED(where.modules.empty(),
                                "[custom_model] expected no pipeline split, got {} modules. Set "
                                "parallelism.pipeline_parallel_degree 1.",
                                where.modules.size());
    return std::make_shared<ParallelLM>(args, at::TensorOptions().device(where.device));
  }
  at::Tensor forward(const at::Tensor& tokens, const nn::AttentionContext& context = {}) const {
    at::Tensor h = embed->forward(tokens);  // (B, S, D)
    for (const auto& b : blocks) h = b->forward(h, rope_, context);
    return head->forward(norm->forward(h));  // (B, S, V), or (B, S, V/tp) under loss parallel
  }
  at::Tensor forward_part(const at::Tensor& x, const std::vector<std::string>&,
                          const nn::AttentionContext& context = {}) const {
    return forward(x, context);  // build() refuses pipeline parts
  }
  void init_weights() {  // each parameter draws by its name: every layout gets the same values
    const nn::InitSite root = nn::InitSite::current();
    nn::normal_(embed->weight, root / "embed.weight", 0.0, 1.0);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const nn::InitSite b = root / fmt::format("blocks.{}", i);
      blocks[i]->norm->reset_parameters();
      blocks[i]->attention->init_weights(b / "attention", 0.02);
      nn::trunc_normal_(blocks[i]->up->weight, b / "up.weight", 0.0, 0.02, -2.0, 2.0);
      nn::trunc_normal_(blocks[i]->down->weight, b / "down.weight", 0.0, 0.01, -2.0, 2.0);
    }
    norm->reset_parameters();
    nn::trunc_normal_(head->weight, root / "head.weight", 0.0, 0.02, -2.0, 2.0);
  }
  std::vector<at::Tensor> unique_parameters() const { return parameters(); }
  int64_t vocab_size() const { return vocab_; }
  int64_t num_params() const { return nn::parameter_count(*this); }  // global shapes: the same after parallelize
  int64_t num_flops_per_token(int64_t seq_len) const {               // the embedding is looked up, not multiplied
    return nn::training_flops_per_token({.matmul_params = num_params() - nn::parameter_count(*embed),
                                         .layers = kBlocks,
                                         .heads = kHeads,
                                         .head_dim = kDim / kHeads,
                                         .seq_len = seq_len});
  }
  // FSDP units: the embedding, each block, norm + head; TP as Megatron's, activations replicated between blocks
  // (attention and the MLP read the same normed input, so there is no one module whose input to gather).
  parallel::ShardingSpec sharding_spec() const {
    using Role = parallel::TensorParallelRole;
    parallel::ShardingSpec spec{
        .model = "custom_model", .sequence_parallel = false, .tensor_parallel_divides = {{"heads", kHeads}}};
    spec.fsdp_units.push_back({"embed"});
    spec.tensor_parallel.emplace_back("embed", Role::vocab_embedding);
    for (int64_t i = 0; i < kBlocks; ++i) {
      const std::string b = fmt::format("blocks.{}", i);
      spec.fsdp_units.push_back({b});
      spec.blocks.push_back(b);
      spec.attention.push_back(b + ".attention");
      for (const char* w : {".attention.wq", ".attention.wk", ".attention.wv", ".up"})
        spec.tensor_parallel.emplace_back(b + w, Role::colwise);
      for (const char* w : {".attention.wo", ".down"}) spec.tensor_parallel.emplace_back(b + w, Role::rowwise);
    }
    spec.fsdp_units.push_back({"norm", "head"});
    spec.tensor_parallel.emplace_back("head", Role::head);
    spec.refused.push_back(
        {"pp", "this example builds no pipeline parts. Set parallelism.pipeline_parallel_degree 1."});
    return spec;
  }
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const { return nullptr; }  // no HF twin

  std::shared_ptr<nn::Embedding> embed;        // weight (V, D)
  std::vector<std::shared_ptr<Block>> blocks;  // registered as blocks.<i>
  std::shared_ptr<nn::RMSNorm> norm;           // weight (D)
  std::shared_ptr<nn::Linear> head;            // weight (V, D)

 private:
  int64_t vocab_;
  nn::RopeTables rope_;  // freqs_cis (S, HD/2)
};

}  // namespace

static_assert(TrainableModel<ParallelLM>);

int main(int argc, char** argv) {
  try {
    ConfigNotes notes;
    JobConfig config = parse_args(argc, argv, &notes);
    for (const auto& note : notes) log::warn("{}", note);
    // The model's arguments are its own; the job only says how long a sequence it sees.
    Trainer<ParallelLM> trainer(config, {.max_seq_len = config.training.seq_len});
    trainer.train();
    return 0;
  } catch (const std::exception& e) {
    log::error("{}", error_message(e));
    return 1;
  }
}
