// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/evaluation.hpp"

#include <ATen/ATen.h>

#include <fmt/ranges.h>

#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/parallel/data_parallel.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/train/run_context.hpp"
#include "titan/train/step.hpp"

namespace titan {

Evaluation::Evaluation(const RunContext& run, std::shared_ptr<data::Tokenizer> tokenizer)
    : run_(run), tokenizer_(std::move(tokenizer)) {
  const dist::Mesh& mesh = run.mesh();
  if (mesh.size("pp") != 1 || mesh.size("cp") != 1) {
    throw ConfigError("eval.interval",
                      fmt::format("[titan::Evaluation] expected data and tensor parallelism only, got pp {} and cp {}. "
                                  "Set eval.interval = 0 and run titan-eval on the run's checkpoints.",
                                  mesh.size("pp"), mesh.size("cp")));
  }
  const EvalConfig& c = run.config().eval;
  for (const std::string& path : c.tasks) {
    for (eval::Task& task : eval::read_tasks(path, c.limit)) tasks_.push_back(std::move(task));
  }
  TITAN_CHECK_VALUE(!tasks_.empty(), "[titan::Evaluation] expected task YAMLs in eval.tasks ({}), got none.",
                    fmt::join(c.tasks, ", "));
}

Evaluation::~Evaluation() = default;

bool Evaluation::due(int64_t step) const {
  const int64_t interval = run_.config().eval.interval;
  return interval > 0 && step % interval == 0;
}

std::vector<eval::TaskResult> Evaluation::run(const StepModel& model, const Parallelized& parallel) const {
  const JobConfig& config = run_.config();
  const dist::Mesh& mesh = run_.mesh();
  const int64_t tp = mesh.size("tp");
  // The model as training runs it: a sequence split over tp needs a length it divides (right padding changes
  // no causal position before it), and loss parallelism leaves each tp rank a slice of the vocabulary.
  const eval::LogitsFn forward = [&](const at::Tensor& tokens) {
    const int64_t length = tokens.size(1), padded = (length + tp - 1) / tp * tp;
    const at::Tensor input = padded == length ? tokens : at::constant_pad_nd(tokens, {0, padded - length}, 0);
    at::Tensor logits = model.forward(input, {}).slice(1, 0, length).contiguous();  // (B, S, V / tp)
    if (!parallel.loss_parallel() || tp == 1) return logits;
    at::Tensor gathered = at::empty({tp * logits.numel()}, logits.options());
    mesh.group("tp").all_gather(gathered, logits).wait();
    return gathered.view({tp, logits.size(0), logits.size(1), logits.size(2)})
        .permute({1, 2, 0, 3})
        .reshape({logits.size(0), logits.size(1), tp * logits.size(2)});  // (B, S, V)
  };
  const eval::ScoringOptions options{
      .max_length = config.eval.max_length > 0 ? config.eval.max_length : config.training.seq_len,
      .batch_size = config.eval.batch_size,
      .device = run_.device(),
      .dp_rank = mesh.coordinate("dp"),
      .dp_size = mesh.size("dp"),
      .all_reduce_sum = [&mesh](at::Tensor& t) {
        at::Tensor on_group = t.to(mesh.group("dp").device());
        mesh.group("dp").all_reduce(on_group).wait();
        t.copy_(on_group);
      }};
  std::vector<eval::TaskResult> results;
  for (const eval::Task& task : tasks_) results.push_back(eval::evaluate(task, *tokenizer_, forward, options));
  if (parallel.data_parallel()) parallel.data_parallel()->reshard();  // the no-grad forwards left units gathered
  return results;
}

std::vector<std::pair<std::string, double>> Evaluation::scalars(const std::vector<eval::TaskResult>& results) {
  std::vector<std::pair<std::string, double>> out;
  for (const eval::TaskResult& r : results) {
    for (const auto& [metric, value] : r.metrics) out.emplace_back(fmt::format("eval/{}/{}", r.task, metric), value);
  }
  return out;
}

}  // namespace titan
