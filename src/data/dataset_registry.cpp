// SPDX-License-Identifier: BSD-3-Clause
// The named-dataset registry behind training.dataset (torchtitan's DATASETS table).
#include <fmt/ranges.h>

#include <map>
#include <mutex>

#include "titan/core/error.hpp"
#include "titan/data/corpus.hpp"

namespace titan::data {
namespace {

struct Entry {
  CorpusSpec spec;
  std::string missing_hint;
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, Entry> entries;

  Registry() {
    // The project's default data: setup installs Debian's `fortunes` and `fortunes-min`.
    entries["fortunes"] = {{.format = DatasetFormat::fortunes, .path = "/usr/share/games/fortunes"},
                           "Install Debian's fortunes (apt-get install fortunes fortunes-min) or point "
                           "training.dataset_path at a folder of fortune files."};
    // allenai/c4 "en" as downloaded from Hugging Face: en/c4-train.00000-of-01024.json.gz, ...
    entries["c4"] = {{.format = DatasetFormat::jsonl, .path = {}},
                     "Download the shards (git lfs pull --include \"en/*\" in a clone of "
                     "https://huggingface.co/datasets/allenai/c4) and set training.dataset_path to the en/ folder "
                     "or a glob such as en/c4-train.*.json.gz."};
    entries["c4_validation"] = {{.format = DatasetFormat::jsonl, .path = {}},
                                "Set validation.dataset_path to the C4 en/ folder's validation shards, e.g. "
                                "en/c4-validation.*.json.gz."};
    entries["tinyshakespeare"] = {{.format = DatasetFormat::text, .path = {}},
                                  "Download karpathy/char-rnn's data/tinyshakespeare/input.txt and set "
                                  "training.dataset_path to it."};
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_dataset(const std::string& name, CorpusSpec spec, std::string missing_hint) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.entries[name] = {std::move(spec), std::move(missing_hint)};
}

std::vector<std::string> registered_datasets() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, entry] : r.entries) names.push_back(name);
  return names;
}

CorpusSpec dataset_spec(const std::string& name, const std::filesystem::path& dataset_path) {
  Entry entry;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    const auto it = r.entries.find(name);
    if (it == r.entries.end()) {
      std::vector<std::string> names;
      for (const auto& [n, e] : r.entries) names.push_back(n);
      TITAN_CHECK_VALUE(false,
                        "[titan::data::load_dataset] expected training.dataset to be one of [{}], got \"{}\". "
                        "Register it with titan::data::register_dataset(\"{}\", spec).",
                        fmt::join(names, ", "), name, name);
    }
    entry = it->second;
  }
  if (!dataset_path.empty()) entry.spec.path = dataset_path;
  TITAN_CHECK_VALUE(!entry.spec.path.empty(),
                    "[titan::data::load_dataset] dataset \"{}\": expected a path, got none "
                    "(it has no default location). {}",
                    name, entry.missing_hint);
  const bool glob = entry.spec.path.string().find_first_of("*?[") != std::string::npos;
  TITAN_CHECK_VALUE(glob || std::filesystem::exists(entry.spec.path),
                    "[titan::data::load_dataset] dataset \"{}\": expected its "
                    "data at {}, got nothing there. {}",
                    name, entry.spec.path.string(), entry.missing_hint);
  return entry.spec;
}

std::shared_ptr<Corpus> load_dataset(const std::string& name, const std::filesystem::path& dataset_path) {
  return open_corpus(name, dataset_spec(name, dataset_path));
}

}  // namespace titan::data
