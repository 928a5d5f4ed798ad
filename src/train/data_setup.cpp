// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/data_setup.hpp"

#include <cstdlib>
#include <filesystem>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/data/auto_tokenizer.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/data/source.hpp"
#include "titan/data/tokenizer.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/train/run_context.hpp"

namespace titan {
namespace {

// $TITAN_CACHE_DIR, else $XDG_CACHE_HOME/titan, else ~/.cache/titan: shared by every run on the machine.
std::filesystem::path cache_dir() {
  if (const char* dir = std::getenv("TITAN_CACHE_DIR")) return std::filesystem::path(dir) / "tokenizers";
  if (const char* xdg = std::getenv("XDG_CACHE_HOME")) return std::filesystem::path(xdg) / "titan" / "tokenizers";
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home != nullptr ? home : ".") / ".cache" / "titan" / "tokenizers";
}

// torchtitan's default training.dataset, the C4 sample in torchtitan's own repository. titan does not ship
// it: given without a path, titan's default corpus stands in, so torchtitan's debug job and a run with
// no arguments train at once instead of stopping.
constexpr const char* kTorchtitanSample = "c4_test";
constexpr const char* kDefaultCorpus = "fortunes";

bool default_corpus_stands_in(const TrainingConfig& t) {
  return t.dataset == kTorchtitanSample && !t.dataset_path.has_value() && t.dataset_mixture.empty();
}

std::shared_ptr<data::Source> open_dataset(const TrainingConfig& t, const std::string& name, const std::string& path) {
  data::CorpusSpec spec = data::dataset_spec(name, path);
  if (t.dataset_text_field) spec.text_field = *t.dataset_text_field;
  if (t.dataset_format) spec.format = *t.dataset_format;
  spec.on_bad_record = t.dataset_on_bad_record;
  return data::open_source(name, spec);
}

// "name:weight" or "name:weight:path".
data::WeightedSource mixture_entry(const TrainingConfig& t, const std::string& entry) {
  const size_t a = entry.find(':');
  const size_t b = a == std::string::npos ? a : entry.find(':', a + 1);
  double weight = 0;
  try {
    weight = std::stod(entry.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1));
  } catch (const std::exception&) {
    weight = 0;
  }
  if (a == std::string::npos || !(weight > 0)) {
    throw ConfigError("training.dataset_mixture",
                      fmt::format("[titan::build_sources] expected training.dataset_mixture entries \"name:weight\" "
                                  "or \"name:weight:path\" with weight > 0, got \"{}\".",
                                  entry));
  }
  const std::string path = b == std::string::npos ? "" : entry.substr(b + 1);
  return {.source = open_dataset(t, entry.substr(0, a), path), .weight = weight};
}

// What training and validation loaders share; the caller sets the batch shape.
data::DataLoaderOptions loader_config(const TrainingConfig& t, const DataLoaderConfig& workers, int64_t dp_rank,
                                      int64_t dp_degree) {
  return {.local_batch_size = 1,
          .seq_len = 1,
          .dp_rank = dp_rank,
          .dp_degree = dp_degree,
          .grad_accum_steps = 1,
          .packing = t.packing,
          .num_workers = workers.num_workers,
          .prefetch = workers.prefetch_factor.value_or(2),
          .loop = true,
          .seed = 0,
          .add_bos = true,
          .add_eos = true};
}

}  // namespace

std::vector<data::WeightedSource> build_sources(const JobConfig& config) {
  const TrainingConfig& t = config.training;
  std::vector<data::WeightedSource> sources;
  for (const std::string& entry : t.dataset_mixture) sources.push_back(mixture_entry(t, entry));
  if (sources.empty()) {
    const std::string name = default_corpus_stands_in(t) ? kDefaultCorpus : t.dataset;
    sources.push_back({.source = open_dataset(t, name, t.dataset_path.value_or("")), .weight = 1.0});
  }
  return sources;
}

std::shared_ptr<data::Tokenizer> build_tokenizer(const JobConfig& config, int64_t model_vocab_size) {
  if (default_corpus_stands_in(config.training)) {
    log::warn(
        "training.dataset \"{}\" (torchtitan's C4 sample) does not ship with titan: training on the default "
        "corpus \"{}\" (Debian's fortunes quotations) instead. Pick the data with --training.dataset <name> "
        "and --training.dataset_path <file, folder or glob>; see docs/data.md.",
        kTorchtitanSample, kDefaultCorpus);
  }
  // model.tokenizer_path is torchtitan's deprecated spelling of the same thing; it wins when set.
  const std::filesystem::path assets = config.model.tokenizer_path.value_or(config.model.hf_assets_path);
  const data::AutoTokenizerOptions options;
  // A tokenizer is trained on the first source's first documents (only when assets has none).
  auto source = build_sources(config).front().source;
  const auto sample = data::sample_corpus(*source, options.max_training_bytes);
  return data::tokenizer_for(assets, *sample, model_vocab_size, cache_dir(), options);
}

int64_t gradient_accumulation_steps(const JobConfig& config, int64_t dp_degree) {
  const int64_t local = config.training.local_batch_size;
  const int64_t global = config.training.global_batch_size < 0 ? local * dp_degree : config.training.global_batch_size;
  if (global % (local * dp_degree) != 0) {
    // What would work on this layout: a local batch dividing the per-rank share (a restart on another
    // number of ranks meets this first), or the nearest global batches that split into whole microbatches.
    const int64_t unit = local * dp_degree;
    const int64_t below = global / unit * unit;
    const std::string keep = global % dp_degree == 0
                                 ? fmt::format("set training.local_batch_size to a divisor of {} (= {} / {} ranks)",
                                               global / dp_degree, global, dp_degree)
                                 : fmt::format("run on a data-parallel degree that divides {}", global);
    const std::string nearest =
        below > 0 ? fmt::format("{} or {}", below, below + unit) : fmt::format("{}", below + unit);
    throw ConfigError("training.global_batch_size",
                      fmt::format("[titan::Trainer] expected training.global_batch_size ({}) to be a multiple of "
                                  "training.local_batch_size ({}) x data-parallel degree ({}) = {}, so every rank "
                                  "accumulates whole microbatches. To keep the global batch {} (and a checkpoint's "
                                  "sample sequence), {}; or set training.global_batch_size to {}, which changes it.",
                                  global, local, dp_degree, unit, global, keep, nearest));
  }
  return global / (local * dp_degree);
}

std::unique_ptr<data::DataLoader> build_dataloader(const JobConfig& config, std::shared_ptr<data::Tokenizer> tokenizer,
                                                   int64_t dp_rank, int64_t dp_degree) {
  const TrainingConfig& t = config.training;
  data::DataLoaderOptions c = loader_config(t, t.dataloader, dp_rank, dp_degree);
  c.local_batch_size = t.local_batch_size;
  c.seq_len = t.seq_len;
  c.grad_accum_steps = gradient_accumulation_steps(config, dp_degree);
  return std::make_unique<data::DataLoader>(build_sources(config), std::move(tokenizer), c);
}

std::unique_ptr<data::DataLoader> build_validation_dataloader(const JobConfig& config,
                                                              std::shared_ptr<data::Tokenizer> tokenizer,
                                                              int64_t dp_rank, int64_t dp_degree) {
  const ValidationConfig& v = config.validation;
  data::DataLoaderOptions c = loader_config(config.training, v.dataloader, dp_rank, dp_degree);
  c.local_batch_size = v.local_batch_size;
  c.seq_len = v.seq_len;
  c.loop = false;  // one pass: the whole validation set, or validation.steps batches of it
  std::vector<data::WeightedSource> sources{
      {.source = open_dataset(config.training, v.dataset, v.dataset_path.value_or("")), .weight = 1.0}};
  return std::make_unique<data::DataLoader>(std::move(sources), std::move(tokenizer), c);
}

}  // namespace titan

namespace titan {

std::shared_ptr<data::Tokenizer> build_tokenizer(const RunContext& run, int64_t model_vocab_size) {
  const JobConfig& config = run.config();
  // Rank 0 first: a tokenizer trained on first use is written to the cache, which the others read.
  std::shared_ptr<data::Tokenizer> tokenizer;
  if (run.mesh().rank() == 0) tokenizer = build_tokenizer(config, model_vocab_size);
  run.mesh().group("world").barrier();
  if (run.mesh().rank() != 0) tokenizer = build_tokenizer(config, model_vocab_size);
  TITAN_CHECK_VALUE(tokenizer->vocab_size() <= model_vocab_size,
                    "[titan::Trainer] expected a tokenizer with at most {} tokens (the model's vocab_size), got {} "
                    "from model.hf_assets_path='{}'. Use a matching tokenizer or flavor.",
                    model_vocab_size, tokenizer->vocab_size(), config.model.hf_assets_path);
  return tokenizer;
}

}  // namespace titan
