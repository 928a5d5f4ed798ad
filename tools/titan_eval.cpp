// SPDX-License-Identifier: BSD-3-Clause
// titan-eval: lm-eval-harness's log-likelihood tasks and the perplexity of text files on a checkpoint of any
// registered model, in place: the model built and sharded as the trainer shards it (FSDP, TP), no conversion
// (docs/evaluation.md).
//   titan-eval [--checkpoint PATH] [--tasks FILE|DIR ...] [--text FILE ...] [--paragraphs] [--max-length N]
//              [--batch-size N] [--limit N] [--output text|jsonl] [--samples]
//              [config keys: --job.config_file FILE, --model.flavor NAME, --model.hf_assets_path DIR, ...]
//     --tasks: an lm-eval task YAML over local JSON/JSON-lines data, or a folder of them; --text: a plain text
//     file scored whole (or by paragraph) in rolling windows. PATH as titan-generate takes it.
//   titan-run --nproc-per-node 2 titan-eval ... --parallelism.data_parallel_shard_degree 2   FSDP, each rank
//   scoring half of the batches; --parallelism.tensor_parallel_degree 2 splits every layer.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/tool_args.hpp"
#include "titan/data/tokenizer.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/eval/evaluator.hpp"
#include "titan/models/decoder.hpp"
#include "titan/parallel/data_parallel.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/train/inference.hpp"

namespace fs = std::filesystem;
using namespace titan;

namespace {

const ToolSpec kSpec = {
    .name = "titan-eval",
    .usage =
        "usage: titan-eval [--checkpoint PATH] [--tasks FILE|DIR ...] [--text FILE ...] [--paragraphs]\n"
        "                  [--max-length N] [--batch-size N] [--limit N] [--output text|jsonl] [--samples]\n"
        "                  [config keys: --job.config_file FILE, --model.flavor NAME, --model.hf_assets_path DIR,\n"
        "                  --parallelism.data_parallel_shard_degree N, --parallelism.tensor_parallel_degree N, ...]\n",
    .flags = {inference_checkpoint_flag(),
              {.name = "--tasks",
               .value = "FILE|DIR",
               .help = "an lm-eval task YAML over local data, or a folder of them (repeat the flag)"},
              {.name = "--text", .value = "FILE", .help = "the perplexity of a text file (repeat the flag)"},
              {.name = "--paragraphs", .help = "score each blank-line separated paragraph of --text on its own"},
              {.name = "--max-length",
               .value = "N",
               .help = "tokens a forward sees, the rolling window (default: training.seq_len)"},
              {.name = "--batch-size", .value = "N", .help = "requests per forward (default 8)"},
              {.name = "--limit", .value = "N", .help = "only the first N documents of each task"},
              {.name = "--output", .value = "text|jsonl", .help = "a table, or one JSON object per task"},
              {.name = "--samples",
               .help = "with --output jsonl: every document's [loglikelihood, greedy, tokens] and metrics"}},
    .keys =
        "model.name, model.flavor, model.hf_assets_path (the tokenizer when the checkpoint has none), "
        "training.seq_len (the default --max-length), parallelism.* (FSDP and TP degrees), job.dump_folder and "
        "checkpoint.folder (the default checkpoint)"};

struct Options {
  /// Titan checkpoint (step folder or its parent) or Hugging Face folder.
  std::string checkpoint{};
  /// Task YAMLs, then text files, in the order given.
  std::vector<eval::Task> tasks{};
  /// Scoring: max_length and batch size (the ranks are filled in by run).
  eval::ScoringOptions scoring{};
  /// text: a table; jsonl: one JSON object per task.
  std::string output = "text";
  /// Per-document responses in the JSON.
  bool samples = false;
};

Options options_of(const ToolArgs& args) {
  const JobConfig& config = args.config;
  Options o;
  o.checkpoint = inference_checkpoint_path(args);
  for (const std::string& path : args.values("--tasks")) {
    for (eval::Task& task : eval::read_tasks(path)) o.tasks.push_back(std::move(task));
  }
  for (const std::string& path : args.values("--text"))
    o.tasks.push_back(eval::text_task(path, args.has("--paragraphs")));
  TITAN_CHECK_VALUE(!o.tasks.empty(), "[titan-eval] expected at least one --tasks FILE|DIR or --text FILE, got none.");
  const int64_t limit = args.integer("--limit", -1);
  TITAN_CHECK_VALUE(limit == -1 || limit >= 1, "[titan-eval] expected --limit >= 1, got {}.", limit);
  for (eval::Task& task : o.tasks) {
    if (limit > 0 && static_cast<int64_t>(task.docs.size()) > limit) task.docs.resize(static_cast<size_t>(limit));
  }
  o.scoring.max_length = args.integer("--max-length", config.training.seq_len);
  TITAN_CHECK_VALUE(o.scoring.max_length >= 1, "[titan-eval] expected --max-length >= 1, got {}.",
                    o.scoring.max_length);
  o.scoring.batch_size = args.integer("--batch-size", o.scoring.batch_size);
  TITAN_CHECK_VALUE(o.scoring.batch_size >= 1, "[titan-eval] expected --batch-size >= 1, got {}.",
                    o.scoring.batch_size);
  o.output = args.value("--output").value_or("text");
  TITAN_CHECK_VALUE(o.output == "text" || o.output == "jsonl", "[titan-eval] expected --output text|jsonl, got '{}'.",
                    o.output);
  o.samples = args.has("--samples");
  return o;
}

// The trainer's plan for this mesh (FSDP units, TP styles), without what only training needs: no activation
// checkpointing, and whole logits (no loss parallel, no sequence split: scoring reads every position's full row).
parallel::ParallelPlan eval_plan(const models::Decoder& model, const JobConfig& config, const dist::Mesh& mesh,
                                 bool cuda) {
  parallel::PlanOptions options = parallel::plan_options(config, model, cuda);
  options.activation_checkpoint.mode = AcMode::none;
  options.parallelism.disable_loss_parallel = true;
  parallel::ParallelPlan plan = parallel::plan(model.sharding_spec(), options, mesh.shape());
  if (mesh.size("tp") > 1) {
    plan.tensor_parallel = parallel::tensor_parallel_plan(model.sharding_spec(), mesh.size("tp"),
                                                          /*sequence_parallel=*/false, /*loss_parallel=*/false);
  }
  return plan;
}

int run(Options o, const JobConfig& config) {
  const at::Device device = inference_device();
  const dist::Mesh mesh = inference_mesh(config, device);
  TITAN_CHECK_NOT_IMPLEMENTED(
      mesh.size("pp") == 1 && mesh.size("cp") == 1,
      "[titan-eval] expected data parallelism and tensor parallelism only, got pp {} and cp {}. Unset "
      "parallelism.pipeline_parallel_degree and parallelism.context_parallel_degree.",
      mesh.size("pp"), mesh.size("cp"));

  const InferenceCheckpoint source = resolve_inference_checkpoint(o.checkpoint, kSpec.name);
  const auto model = build_inference_model(source, config, o.scoring.max_length, device, kSpec.name);
  const models::DecoderShape& shape = model->shape();
  const auto tokenizer = inference_tokenizer(source, config, shape.vocab_size, mesh);
  TITAN_CHECK_VALUE(tokenizer->vocab_size() <= shape.vocab_size,
                    "[titan-eval] expected a tokenizer of at most the model's {} tokens, got {} tokens. Use the "
                    "tokenizer the model was trained with (--model.hf_assets_path).",
                    shape.vocab_size, tokenizer->vocab_size());
  const Parallelized parallel = parallelize(*model, mesh, eval_plan(*model, config, mesh, device.is_cuda()));
  load_inference_weights(*model, parallel, source, mesh);

  o.scoring.device = device;
  o.scoring.dp_rank = mesh.coordinate("dp");
  o.scoring.dp_size = mesh.size("dp");
  o.scoring.all_reduce_sum = [&mesh](at::Tensor& t) {
    at::Tensor on_group = t.to(mesh.group("dp").device());
    mesh.group("dp").all_reduce(on_group).wait();
    t.copy_(on_group);
  };
  const eval::LogitsFn forward = [&](const at::Tensor& tokens) { return model->forward(tokens); };
  std::vector<eval::TaskResult> results;
  for (const eval::Task& task : o.tasks) {
    results.push_back(eval::evaluate(task, *tokenizer, forward, o.scoring));
    const eval::TaskResult& r = results.back();
    log::info("{}: {} documents, {} forwards of {} tokens ({} scored) in {:.2f} s ({:.0f} tokens/s on this rank)",
              r.task, r.docs.size(), r.stats.forwards, r.stats.input_tokens, r.stats.scored_tokens, r.seconds,
              static_cast<double>(r.stats.input_tokens) / r.seconds);
  }
  if (parallel.data_parallel()) parallel.data_parallel()->reshard();
  if (mesh.rank() != 0) return 0;
  if (o.output == "jsonl") {
    for (const eval::TaskResult& r : results) std::cout << eval::result_json(r, o.samples).dump() << "\n";
  } else {
    std::cout << eval::format_results(results);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_tool(kSpec, argc, argv, [&](const ToolArgs& args) { return run(options_of(args), args.config); });
}
