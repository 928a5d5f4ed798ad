// SPDX-License-Identifier: BSD-3-Clause
// DeepSeek-V3's multi-token prediction (models/multi_token_prediction.hpp): the loss and every gradient against the
// report's equations written out here in plain ATen; FSDP 2 against one process; the Hugging Face layout of the MTP
// weights (model.layers.{L+k}.*) out and back; the job keys; the Trainer logging the MTP loss apart while the
// next-token loss stays that of a run without MTP.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <sstream>

#include "models/decoder_train_util.hpp"
#include "test_util.hpp"
#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/hf.hpp"
#include "titan/core/config.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/models/deepseek_v3/hf_adapter.hpp"
#include "titan/models/deepseek_v3/model.hpp"
#include "titan/models/job_args.hpp"
#include "titan/nn/loss.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/data_setup.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

namespace deepseek_v3_mtp_test {
namespace {

using namespace titan;
namespace fs = std::filesystem;

constexpr int64_t kSeq = 16;
constexpr int64_t kMtpSteps = 8;
constexpr double kMtpLr = 1e-3;

// The tiny flavor (a dense block, MoE blocks with shared experts, MLA) with two MTP depths; the depths' blocks are
// MoE blocks (layer ids 3 and 4 >= n_dense_layers).
deepseek_v3::DeepSeekV3Args mtp_args() {
  deepseek_v3::DeepSeekV3Args a = deepseek_v3::flavor("tiny");
  a.vocab_size = 256;
  a.max_seq_len = kSeq;
  a.num_nextn_predict_layers = 2;
  a.mtp_loss_scaling_factor = 0.3;
  return a;
}

std::shared_ptr<deepseek_v3::DeepSeekV3> initialised(const deepseek_v3::DeepSeekV3Args& args, uint64_t seed) {
  nn::manual_init_seed(seed);
  auto model = deepseek_v3::DeepSeekV3::build(args, {.device = at::kCPU});
  model->init_weights();
  return model;
}

// ---- the report's equations, written out -----------------------------------------------------------------------

at::Tensor rms(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * w;
}

// sum_i -log softmax(logits_i)[target_i] in double over the targets other than kIgnoreIndex: logits (B, N, V),
// targets (B, N).
at::Tensor ce_sum(const at::Tensor& logits, const at::Tensor& targets) {
  const at::Tensor picked = at::log_softmax(logits.to(at::kDouble), -1).gather(-1, targets.clamp_min(0).unsqueeze(-1));
  return -(picked.squeeze(-1) * (targets != kIgnoreIndex)).sum();
}

struct Reference {
  at::Tensor main;  // () the next-token loss, a mean over the B*S labels
  at::Tensor mtp;   // () lambda / D * sum_k CE_k / (B*S)
};

// Depth k runs on the S - k positions i whose t_{i+k} is in the sequence (truncated streams, no filler). Without
// `mtp_labels`, CE_k sums over the S - k - 1 of them whose target t_{i+k+1} is; with them (Megatron's rolled labels and
// mask), over the S - k whose label_{i+k} is not -100. Both losses are divided by `count` (B*S unless given).
Reference reference(const deepseek_v3::DeepSeekV3& m, const at::Tensor& input, const at::Tensor& labels,
                    const at::Tensor& mtp_labels = {}, double count = 0) {
  const deepseek_v3::DeepSeekV3Args& a = m.args();
  const int64_t batch = input.size(0), seq = input.size(1), depth = a.num_nextn_predict_layers;
  std::vector<std::string> blocks{"tok_embeddings"};
  for (int64_t i = 0; i < a.n_layers; ++i) blocks.push_back("layers." + std::to_string(i));
  const at::Tensor h = m.forward_part(input, blocks);  // (B, S, D): h^0, before the final norm
  const at::Tensor emb = m.tok_embeddings->weight;     // (V, D)
  const at::Tensor head = m.output->weight;            // (V, D)
  const double positions = count > 0 ? count : static_cast<double>(batch * seq);
  Reference out{.main = ce_sum(at::matmul(rms(h, m.norm->weight, a.norm_eps), head.t()), labels) / positions,
                .mtp = at::Tensor()};
  const nn::RopeTables rope = nn::make_rope_tables(
      nn::rope_frequencies({.head_dim = a.qk_rope_head_dim, .theta = a.rope_theta, .llama3_scaling = false}), seq,
      at::kCPU);
  at::Tensor prev = h;  // (B, S - k + 1, D): h^{k-1}
  at::Tensor total = at::zeros({}, at::kDouble);
  for (int64_t k = 1; k <= depth; ++k) {
    const models::MtpModule& mod = *m.mtp->modules[static_cast<size_t>(k - 1)];
    const int64_t len = seq - k;
    const at::Tensor e = at::embedding(emb, input.narrow(1, k, len));  // (B, len, D): Emb(t_{i+k})
    // [RMSNorm(Emb(t_{i+k})); RMSNorm(h^{k-1}_i)]: DeepSeek's checkpoint puts the embedding's half first.
    const at::Tensor joined = at::cat(
        {rms(e, mod.enorm->weight, a.norm_eps), rms(prev.narrow(1, 0, len), mod.hnorm->weight, a.norm_eps)}, -1);
    prev = mod.block->forward(at::matmul(joined, mod.eh_proj->weight.t()), rope, {});         // (B, len, D): h^k
    const at::Tensor logits = at::matmul(rms(prev, mod.norm->weight, a.norm_eps), head.t());  // (B, len, V)
    total = total + (mtp_labels.defined() ? ce_sum(logits, mtp_labels.narrow(1, k, len))
                                          : ce_sum(logits.narrow(1, 0, len - 1), input.narrow(1, k + 1, len - 1)));
  }
  out.mtp = total * (a.mtp_loss_scaling_factor / static_cast<double>(depth)) / positions;
  return out;
}

std::map<std::string, at::Tensor> gradients(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters()) {
    if (item.value().grad().defined()) out[item.key()] = item.value().grad().clone();
  }
  return out;
}

// Every gradient of `expected` within 1e-6 (absolute) in `got`, each named when it is not.
void check_gradients_near(const std::map<std::string, at::Tensor>& got,
                          const std::map<std::string, at::Tensor>& expected) {
  for (const auto& [name, g] : expected) {
    const double diff = (got.at(name) - g).abs().max().item<double>();
    INFO(name << " max abs diff " << diff << " of max " << g.abs().max().item<double>());
    CHECK(diff < 1e-6);
  }
}

}  // namespace

// Tolerance: both sides compute the same fp32 function (the reference reuses titan's decoder block, which the other
// DeepSeek-V3 tests hold to torchtitan and transformers, and writes everything MTP adds around it), with the sums in
// another order: the reference's cross-entropy in double, its depth-k streams truncated rather than filled. fp32
// rounding is ~6e-8 relative per operation, so the losses (~5.5) agree to ~1e-7 relative and the gradients (entries
// up to ~1e-2 after the 1/(B*S) mean) to ~1e-9 absolute; 1e-6 keeps that margin, while a wrong shift, a missing
// 1/D or lambda, or a swapped concatenation changes a loss by >1e-2 and a gradient by its own size.
TEST_CASE("deepseek_v3 multi-token prediction: loss and gradients equal the report's equations",
          "[models][deepseek_v3][mtp]") {
  const deepseek_v3::DeepSeekV3Args args = mtp_args();
  const auto model = initialised(args, 3);
  const auto ref_model = initialised(args, 3);  // the same weights: each parameter draws from its own name
  const auto [input, labels] = test::global_batch(0, {.global_batch = 2, .seq_len = kSeq}, args.vocab_size);
  const double positions = static_cast<double>(input.numel());

  // titan: the trainer's loss on the logits; the MTP loss rides on the hidden states into the same backward.
  model->mtp->loss_scale = 1.0 / positions;
  const at::Tensor main = cross_entropy_sum(model->forward(input), labels) / positions;  // ()
  main.backward();
  const double mtp = model->mtp->loss.item<double>() * args.mtp_loss_scaling_factor;

  const Reference ref = reference(*ref_model, input, labels);
  (ref.main + ref.mtp).backward();
  CHECK(main.item<double>() == Approx(ref.main.item<double>()).epsilon(1e-6));
  CHECK(mtp == Approx(ref.mtp.item<double>()).epsilon(1e-6));
  CHECK(ref.mtp.item<double>() > 0.1);  // the depths' losses are there (lambda 0.3 x ~5.5)

  const auto got = gradients(*model), expected = gradients(*ref_model);
  REQUIRE(got.size() == expected.size());
  CHECK(got.count("mtp.1.eh_proj.weight") == 1);
  CHECK(got.count("mtp.0.block.moe.experts.w1") == 1);
  check_gradients_near(got, expected);

  // Without grad (evaluation) the model is the next-token model: the same logits, nothing injected.
  at::NoGradGuard no_grad;
  model->mtp->loss.zero_();
  CHECK(at::equal(model->forward(input), ref_model->forward(input)));
  CHECK(model->mtp->loss.item<double>() == 0.0);
}

namespace {

// An SFT-style batch: row b's labels are -100 over its first prompt[b] positions, the last row also over its last
// `padding` (a padded conversation), and t_{i+1} elsewhere, the last column's the token after the window.
at::Tensor sft_labels(const at::Tensor& input, const std::vector<int64_t>& prompt, int64_t padding, int64_t vocab) {
  const int64_t seq = input.size(1);
  const at::Tensor after = at::remainder(input.select(1, 0) + 7, vocab).unsqueeze(1);  // (B, 1): t_S
  at::Tensor labels = at::cat({input.narrow(1, 1, seq - 1), after}, 1);                // (B, S)
  for (size_t b = 0; b < prompt.size(); ++b) labels[static_cast<int64_t>(b)].narrow(0, 0, prompt[b]).fill_(-100);
  labels[-1].narrow(0, seq - padding, padding).fill_(-100);
  return labels;
}

}  // namespace

// Tolerance: the test above's, argued there (the same computation; the mask only drops terms of the sums). The masked
// and the unmasked objectives differ by >1e-2 (a third of the targets dropped), so a module that trains the prompt
// positions, or shifts the mask by one, fails the loss check by far more than 1e-6.
TEST_CASE("deepseek_v3 multi-token prediction: a label mask drops the masked targets from the loss and its gradients",
          "[models][deepseek_v3][mtp]") {
  const deepseek_v3::DeepSeekV3Args args = mtp_args();
  const auto model = initialised(args, 4);
  const auto ref_model = initialised(args, 4);
  const at::Tensor input = test::global_batch(1, {.global_batch = 2, .seq_len = kSeq}, args.vocab_size).first;
  const at::Tensor labels = sft_labels(input, {5, 3}, /*padding=*/4, args.vocab_size);  // (B, S)
  const double valid = static_cast<double>(count_valid_tokens(labels));

  model->mtp->loss_scale = 1.0 / valid;
  model->mtp->labels = labels;
  const at::Tensor main = cross_entropy_sum(model->forward(input), labels) / valid;  // ()
  main.backward();
  const double mtp = model->mtp->loss.item<double>() * args.mtp_loss_scaling_factor;

  const Reference ref = reference(*ref_model, input, labels, labels, valid);
  (ref.main + ref.mtp).backward();
  CHECK(main.item<double>() == Approx(ref.main.item<double>()).epsilon(1e-6));
  CHECK(mtp == Approx(ref.mtp.item<double>()).epsilon(1e-6));
  {
    at::NoGradGuard no_grad;
    const at::Tensor unmasked = sft_labels(input, {0, 0}, /*padding=*/0, args.vocab_size);
    const double all = reference(*ref_model, input, labels, unmasked, valid).mtp.item<double>();
    INFO("the MTP loss without the mask: " << all);
    CHECK(std::abs(all - mtp) > 1e-2);
  }
  const auto got = gradients(*model), expected = gradients(*ref_model);
  REQUIRE(got.size() == expected.size());
  check_gradients_near(got, expected);
  // Labels of another shape are refused by name.
  model->mtp->labels = labels.narrow(1, 0, kSeq - 1);
  CHECK_THAT(test::error_of([&] { (void)model->forward(input); }), Catch::Contains("expected labels of the tokens'"));
}

namespace {

// The MTP model's training under test::train_decoder, the MTP loss of each step (summed over the data-parallel ranks)
// recorded beside the weights.
test::NamedRun train_mtp(const dist::Mesh& mesh) {
  const test::ParityRun batches{.global_batch = 4, .seq_len = kSeq};
  at::Tensor mtp_losses = at::zeros({kMtpSteps}, at::kDouble);  // (steps)
  test::NamedRun out = test::train_decoder<deepseek_v3::DeepSeekV3>(
      mesh, mtp_args(),
      {.steps = kMtpSteps,
       .lr = kMtpLr,
       .batches = batches,
       .seed = 7,
       .prepared =
           [&](deepseek_v3::DeepSeekV3& m) {
             m.mtp->loss_scale = 1.0 / static_cast<double>(batches.global_batch * batches.seq_len);
           },
       .before_step = [](deepseek_v3::DeepSeekV3& m, int64_t) { m.mtp->loss.zero_(); },
       .after_backward =
           [&](deepseek_v3::DeepSeekV3& m, int64_t step) {
             at::Tensor mtp = m.mtp->loss.to(at::kDouble).reshape({1});  // (1)
             if (mesh.size("dp") > 1) mesh.group("dp").all_reduce(mtp).wait();
             mtp_losses[step].copy_(mtp[0]);
           }});
  out.weights["(mtp loss of each step)"] = mtp_losses;
  return out;
}

}  // namespace

// Tolerance: check_named_runs' (1e-5), argued in tests/parallel/user_model_parity_test.cpp: the same fp32 math with
// sums in another order. The MTP modules are FSDP units of their own and read the shared embedding and head units a
// second time in the forward; a gradient of theirs lost or counted twice in the reduce-scatter moves the weights by
// up to lr per step.
TEST_CASE("deepseek_v3 with multi-token prediction trains under FSDP 2 as in one process",
          "[models][deepseek_v3][mtp][fsdp][parity]") {
  test::check_named_runs({.dp_shard = 2}, train_mtp);
}

// The depths' MoE layers are in the spec's MoE list: expert parallelism splits their routed experts as the blocks'.
TEST_CASE("deepseek_v3 with multi-token prediction trains under EP 2 as in one process",
          "[models][deepseek_v3][mtp][ep][parity]") {
  test::check_named_runs({.dp_shard = 2, .ep = 2}, train_mtp);
}

TEST_CASE("deepseek_v3 multi-token prediction: FSDP units, and tensor parallelism refused by name",
          "[models][deepseek_v3][mtp][parallel]") {
  const deepseek_v3::DeepSeekV3 model(mtp_args(), kSeq, at::TensorOptions().device(at::kMeta));
  const parallel::ShardingSpec spec = model.sharding_spec();
  const auto& units = spec.fsdp_units;
  // tok_embeddings, layers.0, 2 x 2 for the MoE blocks, 2 x 2 for the MTP depths, norm + output last.
  REQUIRE(units.size() == 1 + 1 + 4 + 4 + 1);
  CHECK(units[7] == std::vector<std::string>{"mtp.0.block.moe.experts"});
  CHECK(units.back() == std::vector<std::string>{"norm", "output"});
  test::check_units_cover_parameters(model, units);
  // Expert parallelism splits the depths' routed experts too.
  CHECK(std::any_of(spec.moe.begin(), spec.moe.end(),
                    [](const parallel::MoeModule& m) { return m.path == "mtp.1.block.moe"; }));
  const std::string error = test::error_of([&] { (void)parallel::plan(model.sharding_spec(), {}, {.tp = 2}); });
  CHECK_THAT(error, Catch::Contains("multi-token prediction under tensor parallelism is not built"));
}

TEST_CASE("deepseek_v3 multi-token prediction from the job keys", "[models][deepseek_v3][mtp][config]") {
  JobConfig config;
  config.model.name = "deepseek_v3";
  config.model.flavor = "tiny";
  config.model.num_nextn_predict_layers = 1;
  const auto model = std::dynamic_pointer_cast<deepseek_v3::DeepSeekV3>(models::build_model(config, 0, {}));
  REQUIRE(model != nullptr);
  REQUIRE(model->mtp != nullptr);
  CHECK(model->mtp->modules.size() == 1);
  CHECK(model->mtp->weight == 0.1);
  const auto plain = deepseek_v3::DeepSeekV3::build(deepseek_v3::flavor("tiny"));
  CHECK(model->num_params() > plain->num_params());
  // The depth's own parameters, its attention and a second pass through the shared head (6 V D) count.
  const deepseek_v3::DeepSeekV3Args& a = model->args();
  CHECK(model->num_flops_per_token(64) > plain->num_flops_per_token(64) + 6 * a.vocab_size * a.dim);
  config.model.name = "llama3";
  config.model.flavor = "debugmodel";
  CHECK_THAT(test::error_of([&] { (void)models::build_model(config, 0, {}); }),
             Catch::Contains("expected model.num_nextn_predict_layers 0 for a family without multi-token prediction"));
}

TEST_CASE("deepseek_v3 multi-token prediction weights round-trip through the Hugging Face layout",
          "[models][deepseek_v3][mtp][hf]") {
  // What an export needs (sigmoid routing with shared experts, as DeepSeek-V3's); rotate-half RoPE makes the import
  // permute the MTP block's rope rows too.
  deepseek_v3::DeepSeekV3Args args = mtp_args();
  args.moe.score_func = "sigmoid";
  args.moe.route_norm = true;
  args.num_nextn_predict_layers = 1;
  const auto source = initialised(args, 21);
  const auto adapter = deepseek_v3::hf_adapter(args, /*yarn=*/false, /*rope_interleave=*/false);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : source->named_parameters()) tensors.emplace_back(item.key(), item.value());
  for (const auto& item : source->named_buffers()) tensors.emplace_back(item.key(), item.value());
  test::TempDir dir;
  checkpoint::save_hf(dir.path / "hf", tensors, *adapter, at::kFloat);

  const checkpoint::HfReader reader(dir.path / "hf");
  CHECK(reader.config().at("num_nextn_predict_layers") == 1);
  // DeepSeek-V3's layout: the depth is layer n_layers (3) with its own tensors and copies of the shared ones.
  for (const char* name :
       {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "self_attn.kv_b_proj.weight",
        "mlp.gate.e_score_correction_bias", "mlp.experts.7.down_proj.weight", "mlp.shared_experts.up_proj.weight"}) {
    INFO(name);
    CHECK(reader.contains(fmt::format("model.layers.3.{}", name)));
  }
  CHECK(at::equal(reader.read("model.layers.3.embed_tokens.weight"), source->tok_embeddings->weight));
  CHECK(at::equal(reader.read("model.layers.3.shared_head.head.weight"), source->output->weight));
  CHECK(at::equal(reader.read("model.layers.3.eh_proj.weight"), source->mtp->modules[0]->eh_proj->weight));

  const auto loaded = initialised(args, 22);
  checkpoint::State state;
  for (const auto& item : loaded->named_parameters()) {
    state.tensors.push_back(checkpoint::state_tensor("model." + item.key(), item.value(), nullptr));
  }
  for (const auto& item : loaded->named_buffers()) {
    state.tensors.push_back(checkpoint::state_tensor("model." + item.key(), item.value(), nullptr));
  }
  checkpoint::load_hf(dir.path / "hf", state, *adapter);
  const auto expected = source->named_parameters();
  for (const auto& item : loaded->named_parameters()) {
    INFO(item.key());
    CHECK(at::equal(item.value(), expected[item.key()]));
  }
  CHECK(at::equal(loaded->mtp->modules[0]->block->moe->expert_bias, source->mtp->modules[0]->block->moe->expert_bias));
}

TEST_CASE(
    "deepseek_v3 multi-token prediction through the Trainer: its loss logged apart, the next-token loss as "
    "without it",
    "[models][deepseek_v3][mtp][train]") {
  test::TempDir dir;
  const auto job = [&](const std::string& name, int64_t depth) {
    JobConfig c = test::tinyshakespeare_job(dir.path / name, /*seq_len=*/16, /*local_batch=*/2, /*steps=*/2,
                                            /*seed=*/5);
    c.model.name = "deepseek_v3";
    c.model.flavor = "tiny";
    c.model.num_nextn_predict_layers = depth;
    c.debug.deterministic = true;
    c.metrics.log_freq = 1;
    return c;
  };
  Trainer<models::Decoder> plain(job("plain", 0));
  plain.train();
  Trainer<models::Decoder> mtp(job("mtp", 1));
  mtp.train();
  // Step 1 runs the same next-token model (the MTP weights are extra, drawn by their own names): the logged loss is
  // the same bitwise. Step 2's differs: the MTP gradient moved the shared weights.
  const std::vector<double> a = plain.core().loss_history(), b = mtp.core().loss_history();
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 2);
  CHECK(a[0] == b[0]);
  CHECK(a[1] != b[1]);
  std::vector<double> logged;
  std::istringstream in(test::read_file(dir.path / "mtp" / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss_metrics/mtp_loss")) logged.push_back(j.at("loss_metrics/mtp_loss").get<double>());
  }
  REQUIRE(logged.size() == 2);
  CHECK(logged[0] > 4.0);  // ~ln(V) from a random init, over the positions with a target two ahead
}

// Tolerance: the equation tests' 1e-6 (the same fp32 computation; the Trainer's activation checkpointing recomputes
// it, bit for bit). The masked and unmasked MTP losses differ by far more (most targets are prompt or padding).
TEST_CASE("deepseek_v3 multi-token prediction through the Trainer on chat data: the prompts' targets left out",
          "[models][deepseek_v3][mtp][train]") {
  test::TempDir dir;
  test::write_file(dir.path / "chat.jsonl",
                   R"({"messages": [{"role": "user", "content": "Who art thou?"}, {"role": "assistant", )"
                   R"("content": "A friend."}]})"
                   "\n"
                   R"({"messages": [{"role": "user", "content": "Speak."}, {"role": "assistant", "content": )"
                   R"("I will, my lord."}]})"
                   "\n");
  JobConfig c = test::tinyshakespeare_job(dir.path / "run", /*seq_len=*/48, /*local_batch=*/2, /*steps=*/1,
                                          /*seed=*/9);
  c.model.name = "deepseek_v3";
  c.model.flavor = "tiny";
  c.model.num_nextn_predict_layers = 2;
  c.training.dataset_path = (dir.path / "chat.jsonl").string();
  c.training.dataset_format = DatasetFormat::chat;
  c.training.packing = Packing::padded;
  Trainer<models::Decoder> trainer(c);
  auto& model = dynamic_cast<deepseek_v3::DeepSeekV3&>(trainer.model());
  // The Trainer's first batch: its loader, built again from the same keys.
  const data::Batch batch = build_dataloader(c, build_tokenizer(c, model.args().vocab_size), 0, 1)->next();
  const int64_t valid = count_valid_tokens(batch.labels);
  REQUIRE(valid > 0);
  CHECK(valid * 3 < batch.labels.numel());  // mostly prompt and padding
  Reference masked, unmasked;
  {
    at::NoGradGuard no_grad;
    masked = reference(model, batch.input, batch.labels, batch.labels, static_cast<double>(valid));
    const at::Tensor all = at::cat({batch.input.narrow(1, 1, batch.input.size(1) - 1), batch.input.narrow(1, 0, 1)}, 1);
    unmasked = reference(model, batch.input, batch.labels, all, static_cast<double>(valid));
  }
  trainer.train_step();
  const double lambda = model.args().mtp_loss_scaling_factor;
  CHECK(trainer.core().loss_history().at(0) == Approx(masked.main.item<double>()).epsilon(1e-6));
  CHECK(model.mtp->loss.item<double>() * lambda == Approx(masked.mtp.item<double>()).epsilon(1e-6));
  CHECK(std::abs(unmasked.mtp.item<double>() - masked.mtp.item<double>()) > 1e-2 * masked.mtp.item<double>());
  CHECK_FALSE(model.mtp->labels.defined());  // handed back after the forward
}

}  // namespace deepseek_v3_mtp_test
