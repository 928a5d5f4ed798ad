// SPDX-License-Identifier: BSD-3-Clause
// Named presets for --config NAME. The llama3 ones mirror torchtitan v0.2.2's TOML job files field for
// field (a test loads each TOML and compares), so `--config llama3_8b` equals `--job.config_file
// llama3_8b.toml`. 1B and 3B have no torchtitan TOML: they follow the 8B recipe.
#include "config_detail.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <mutex>

namespace titan {
namespace {

void llama3_debugmodel(JobConfig& c) {
  c.job.description = "Llama 3 debug training";
  c.profiling.save_traces_folder = "profile_trace";
  c.metrics.log_freq = 1;
  c.lr_scheduler.warmup_steps = 2;
  c.lr_scheduler.decay_ratio = 0.8;
  c.training.steps = 10;
  c.parallelism.pipeline_parallel_schedule = PipelineSchedule::interleaved_1f1b;
  c.checkpoint.interval = 10;
  c.checkpoint.last_save_model_only = false;
  c.float8.filter_fqns = {"output"};
  c.validation.freq = 5;
  c.validation.steps = 10;
}

// What torchtitan's 8B/70B/405B job files share: c4 at 8K context, profiling and TensorBoard on.
struct LargeRecipe {
  std::string flavor;
  std::string hf_assets;  // folder name under ./assets/hf
  double lr;
  int64_t warmup_steps;
  int64_t local_batch_size;
  int64_t steps;
  int64_t tensor_parallel_degree;
  AcMode ac_mode;
};

void apply_large(JobConfig& c, const LargeRecipe& r) {
  c.job.description = fmt::format("Llama 3 {} training", r.flavor);
  c.profiling.enable_profiling = true;
  c.profiling.save_traces_folder = "profile_trace";
  c.profiling.profile_freq = 100;
  c.metrics.enable_tensorboard = true;
  c.model.flavor = r.flavor;
  c.model.hf_assets_path = "./assets/hf/" + r.hf_assets;
  c.optimizer.lr = r.lr;
  c.lr_scheduler.warmup_steps = r.warmup_steps;
  c.training.local_batch_size = r.local_batch_size;
  c.training.seq_len = 8192;
  c.training.steps = r.steps;
  c.training.dataset = "c4";
  c.parallelism.tensor_parallel_degree = r.tensor_parallel_degree;
  c.activation_checkpoint.mode = r.ac_mode;
  if (r.ac_mode == AcMode::selective) c.activation_checkpoint.selective_ac_option = "op";
  c.float8.filter_fqns = {"output"};
  c.validation.freq = 500;
  c.validation.steps = 1200;
}

const LargeRecipe k8B{"8B", "Llama-3.1-8B", 3e-4, 200, 1, 1000, 1, AcMode::selective};

void llama3_405b(JobConfig& c) {
  apply_large(c, {"405B", "Llama-3.1-405B", 8e-5, 600, 2, 3000, 8, AcMode::full});
  c.model.converters = {"float8"};
  c.parallelism.enable_async_tensor_parallel = true;
  c.compile.enable = true;
  c.float8.enable_fsdp_float8_all_gather = true;
  c.float8.precompute_float8_dynamic_scale_for_fsdp = true;
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::function<void(JobConfig&)>, std::less<>> presets;
};

Registry& registry() {
  static Registry r;
  static std::once_flag builtins;
  std::call_once(builtins, [] {
    r.presets["llama3_debugmodel"] = llama3_debugmodel;
    r.presets["llama3_1b"] = [](JobConfig& c) {
      LargeRecipe recipe = k8B;
      recipe.flavor = "1B";
      recipe.hf_assets = "Llama-3.2-1B";
      apply_large(c, recipe);
    };
    r.presets["llama3_3b"] = [](JobConfig& c) {
      LargeRecipe recipe = k8B;
      recipe.flavor = "3B";
      recipe.hf_assets = "Llama-3.2-3B";
      apply_large(c, recipe);
    };
    r.presets["llama3_8b"] = [](JobConfig& c) { apply_large(c, k8B); };
    r.presets["llama3_70b"] = [](JobConfig& c) {
      apply_large(c, {"70B", "Llama-3.1-70B", 1.5e-4, 200, 8, 1000, 8, AcMode::full});
    };
    r.presets["llama3_405b"] = llama3_405b;
  });
  return r;
}

}  // namespace

void register_preset(std::string name, std::function<void(JobConfig&)> apply) {
  TITAN_CHECK_VALUE(!name.empty() && apply,
                    "[titan::config] expected a preset name and function, got name '{}'{}. "
                    "Pass both to register_preset.",
                    name, apply ? "" : " and an empty function");
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.presets[std::move(name)] = std::move(apply);
}

void apply_preset(JobConfig& config, std::string_view name) {
  std::function<void(JobConfig&)> apply;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    if (auto it = r.presets.find(name); it != r.presets.end()) apply = it->second;
  }
  if (!apply) {
    const bool looks_like_file = name.ends_with(".toml") || name.ends_with(".json");
    config_detail::fail("config", fmt::format("expected a preset name for --config, got '{}'. Presets: {}.{}", name,
                                              fmt::join(preset_names(), ", "),
                                              looks_like_file ? " Load files with --job.config_file." : ""));
  }
  apply(config);
}

std::vector<std::string> preset_names() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, apply] : r.presets) names.push_back(name);
  return names;
}

}  // namespace titan
