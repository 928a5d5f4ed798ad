// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/rank_model.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>

#include "titan/dist/mesh.hpp"
#include "titan/float8/converter.hpp"
#include "titan/nn/lora.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/parallel/planner.hpp"
#include "titan/quant/qlora.hpp"
#include "titan/train/mtp_loss.hpp"

namespace titan {

std::vector<std::string> parameter_names(const torch::nn::Module& model, const std::vector<at::Tensor>& params) {
  std::vector<std::string> names;
  const auto named = model.named_parameters(/*recurse=*/true);
  for (const auto& p : params) {
    for (const auto& item : named) {
      if (item.value().unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) {
        names.push_back(item.key());
        break;
      }
    }
  }
  // A pipeline's last stage holds a copy of the first stage's embedding for multi-token prediction: it is that
  // weight, under its one key (the optimizer treats both alike; the checkpoint holds it once).
  for (const at::Tensor& copy : mtp_embedding_copies(model)) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].is_same(copy)) names[i] = kMtpEmbeddingKey;
    }
  }
  return names;
}

namespace detail {

ModelConversion convert_model(const RunContext& run, torch::nn::Module& model, bool log_report, bool part) {
  const JobConfig& config = run.config();
  ModelConversion conversion;
  for (const std::string& name : config.model.converters) {
    if (name == "lora") {
      nn::LoraOptions options = nn::lora_options(config.lora);
      options.require_matches = !part;
      const nn::LoraConversion report = nn::add_lora(model, options);
      // QLoRA's bases are quantised once loaded (TrainingLoop); a shape NF4 cannot cut fails here, on the meta model.
      if (config.lora.quantize_base) quant::lora_base_linears(model);
      conversion.lora = true;
      conversion.adapter_params = report.adapter_params;
      if (log_report) {
        log::info(
            "lora: {} of {} Linear layers adapted (rank {}, alpha {}, dropout {}); every other parameter frozen{}",
            report.adapted.size(), report.linears, config.lora.rank, config.lora.alpha, config.lora.dropout,
            config.lora.quantize_base ? "; their base weights go to NF4 once loaded (QLoRA)" : "");
      }
      continue;
    }
    if (!is_float8_converter(name)) continue;
    const float8::Float8Conversion report = float8::convert_to_float8(model, float8::converter_options(config.float8));
    if (log_report && !report.converted.empty() && run.mesh().size("tp") > 1 &&
        config.float8.recipe_name.value_or(Float8Recipe::tensorwise) != Float8Recipe::tensorwise) {
      log::warn(
          "float8 rowwise recipes under tensor parallelism: each rank scales its own weight and activation shards "
          "(the TP styles give whole-tensor scales to tensorwise float8 only, as torchao's), so losses differ "
          "slightly from one device's float8 run");
    }
    conversion.float8 = report.converted;
  }
  return conversion;
}

void init_converted(const ModelConversion& conversion, torch::nn::Module& model) {
  if (conversion.lora) nn::init_lora(model);
}

parallel::ParallelPlan plan_for_run(const RunContext& run, const parallel::ShardingSpec& spec,
                                    const torch::nn::Module& converted) {
  return parallel::plan(spec, parallel::plan_options(run.config(), converted, run.device().is_cuda()),
                        run.mesh().shape());
}

Parallelized parallelize_for_run(const RunContext& run, torch::nn::Module& model, const parallel::ParallelPlan& plan) {
  Parallelized applied = titan::parallelize(model, run.mesh(), plan);
  if (const std::string what = applied.describe(); what != "one device") log::info("Applied {} to the model", what);
  return applied;
}

void prepare_parameters(const RunContext& run, const std::vector<at::Tensor>& params,
                        const std::vector<at::Tensor>& frozen) {
  const at::ScalarType dtype = scalar_type(run.config().training.dtype);
  if (dtype != at::kFloat) {
    at::NoGradGuard no_grad;
    for (const auto* group : {&params, &frozen}) {
      for (at::Tensor p : *group) p.set_data(p.to(dtype));
    }
  }
  for (at::Tensor p : params) p.requires_grad_(true);
}

std::vector<std::string> rank_modules(const RunContext& run, const parallel::ParallelPlan& plan) {
  if (plan.pipeline.stages.empty()) return {};
  return parallel::pipeline_modules(plan.pipeline, run.mesh());
}

bool bf16_autocast(const RunContext& run, const Parallelized& parallel) {
  // Unlike torchtitan, which turns mixed precision off under TP or PP without FSDP, titan autocasts there.
  const TrainingConfig& training = run.config().training;
  return parallel.data_parallel() == nullptr && training.dtype == DType::float32 &&
         mixed_precision_param(training, run.device().is_cuda()) == DType::bfloat16;
}

std::vector<std::string> embedding_and_head_modules(const parallel::ShardingSpec& spec) {
  using Role = parallel::TensorParallelRole;
  std::vector<std::string> modules;
  for (const auto& [path, role] : spec.tensor_parallel) {
    if (role == Role::vocab_embedding || role == Role::position_embedding || role == Role::head)
      modules.push_back(path);
  }
  return modules;
}

}  // namespace detail
}  // namespace titan
