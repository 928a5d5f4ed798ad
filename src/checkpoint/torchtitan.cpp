// SPDX-License-Identifier: BSD-3-Clause
#include "titan/checkpoint/torchtitan.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <set>

#include "titan/checkpoint/hf.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"

namespace titan::checkpoint {
namespace fs = std::filesystem;
namespace {

// AdamW's (and Adam's) per-parameter state in torch's optimizer state dict, as titan's AdamW names it too.
constexpr std::array<const char*, 3> kTorchtitanAdamStates = {"exp_avg", "exp_avg_sq", "step"};
// torchtitan's CheckpointManager groups besides the model, whose keys are flattened at the top level.
constexpr std::array<const char*, 4> kTorchtitanGroups = {"optimizer", "lr_scheduler", "dataloader", "train_state"};

bool is_group_key(const std::string& key) {
  return std::any_of(kTorchtitanGroups.begin(), kTorchtitanGroups.end(),
                     [&](const char* g) { return key.starts_with(std::string(g) + "."); });
}

// A tensor of parameter `fqn` (or its moment, shaped like it) in titan's row order from torchtitan's, and back.
at::Tensor rows_from(const HfAdapter* halves, const std::string& fqn, const at::Tensor& t) {
  return halves != nullptr && t.dim() > 0 ? halves->from_hf(fqn, t) : t;
}
at::Tensor rows_to(const HfAdapter* halves, const std::string& fqn, const at::Tensor& t) {
  return halves != nullptr && t.dim() > 0 ? halves->to_hf(fqn, t).contiguous() : t;
}

int64_t integer_item(const DcpReader& dcp, const std::string& key) {
  const PyRef v = dcp.read_object(key);
  TITAN_CHECK_VALUE(v->kind == PyValue::Kind::kInt,
                    "[titan::checkpoint::torchtitan] expected an int under '{}' in '{}', got {}. Is this a torchtitan "
                    "checkpoint?",
                    key, dcp.folder().string(), v->describe());
  return v->integer;
}

}  // namespace

State state_from_torchtitan(const DcpReader& dcp, const FromTorchtitan& how) {
  State state;
  const std::set<std::string> params(how.params.begin(), how.params.end());
  std::set<std::string> expected_optimizer;
  for (const auto& [key, info] : dcp.tensors()) {
    if (key.starts_with("optimizer.state.")) {
      expected_optimizer.insert(key);
      continue;
    }
    if (is_group_key(key)) continue;
    // A tied model's head is its embedding: torchtitan's state dict names it twice, titan's parameters once. An
    // untied head would be lost: refused.
    if (!params.contains(key) && key == "output.weight" && params.contains("tok_embeddings.weight")) {
      TITAN_CHECK_VALUE(at::equal(dcp.read_tensor(key), dcp.read_tensor("tok_embeddings.weight")),
                        "[titan::checkpoint::torchtitan] expected output.weight equal to tok_embeddings.weight in '{}' "
                        "(the titan flavor ties them), got a head of its own. Give the flavor the torchtitan run "
                        "trained (--model.flavor).",
                        dcp.folder().string());
      continue;
    }
    if (key.ends_with(".expert_bias")) {  // an MoE buffer: titan keeps it as "moe.<fqn>"
      state.tensors.push_back(state_tensor("moe." + key, dcp.read_tensor(key), nullptr));
      continue;
    }
    TITAN_CHECK_VALUE(params.contains(key) || key.ends_with(".tokens_per_expert"),
                      "[titan::checkpoint::torchtitan] expected the parameters of the titan model (--model.name, "
                      "--model.flavor), got '{}' {} in '{}', which it does not have. Give the model and flavor the "
                      "torchtitan run trained.",
                      key, c10::str(info.shape), dcp.folder().string());
  }
  for (const std::string& fqn : how.params) {
    TITAN_CHECK_VALUE(dcp.tensors().contains(fqn),
                      "[titan::checkpoint::torchtitan] expected parameter '{}' in '{}', got none. Give the model and "
                      "flavor the torchtitan run trained (--model.name, --model.flavor).",
                      fqn, dcp.folder().string());
    state.tensors.push_back(state_tensor("model." + fqn, rows_from(how.halves, fqn, dcp.read_tensor(fqn)), nullptr));
  }
  if (expected_optimizer.empty()) {
    log::info("'{}' holds no optimizer state (saved before the first step): the titan run's AdamW starts fresh",
              dcp.folder().string());
  } else {
    for (const std::string& fqn : how.params) {
      for (const char* name : kTorchtitanAdamStates) {
        const std::string key = fmt::format("optimizer.state.{}.{}", fqn, name);
        TITAN_CHECK_VALUE(expected_optimizer.erase(key) == 1,
                          "[titan::checkpoint::torchtitan] expected AdamW's '{}' in '{}', got none. titan converts "
                          "torch.optim.AdamW / Adam state (exp_avg, exp_avg_sq, step) of every parameter.",
                          key, dcp.folder().string());
        state.tensors.push_back(state_tensor(fmt::format("optimizer.{}.{}", fqn, name),
                                             rows_from(how.halves, fqn, dcp.read_tensor(key)), nullptr));
      }
    }
    TITAN_CHECK_VALUE(expected_optimizer.empty(),
                      "[titan::checkpoint::torchtitan] expected AdamW state (exp_avg, exp_avg_sq, step) of the model's "
                      "parameters, got '{}' in '{}'. titan's AdamW has no such state (amsgrad, another optimizer); "
                      "move the weights alone through Hugging Face safetensors (torchtitan's "
                      "checkpoint.last_save_in_hf, then titan-convert from-hf).",
                      *expected_optimizer.begin(), dcp.folder().string());
  }
  const int64_t step = integer_item(dcp, "train_state.step");
  state.values["train_state"] = {{"step", step}};
  state.values["lr_scheduler"] = {{"last_epoch", integer_item(dcp, "lr_scheduler.last_epoch")}};
  // torchtitan keeps no RNG state; titan's run restores one, so it gets a fresh process's (torch's default seed).
  at::Generator fresh = at::detail::createCPUGenerator(c10::default_rng_seed_val);
  state.tensors.push_back(state_tensor("train_state.rng_cpu", fresh.get_state(), nullptr));
  const bool has_loader = std::any_of(dcp.objects().begin(), dcp.objects().end(),
                                      [](const std::string& k) { return k.starts_with("dataloader."); });
  if (has_loader) {
    log::info(
        "The data loader's state in '{}' is torchtitan's own and does not carry over: the titan run reads its "
        "data from the beginning",
        dcp.folder().string());
  }
  return state;
}

void write_titan_checkpoint(const fs::path& folder, const State& state, int64_t step) {
  const fs::path tmp = folder.parent_path() / fmt::format(".{}.tmp", folder.filename().string());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  // Each tensor in its own dtype: stage() casts the model group to the dtype given, here the weights' own.
  at::ScalarType model_dtype = at::kFloat;
  for (const auto& st : state.tensors) {
    if (is_model_group(st.key)) model_dtype = st.tensor.scalar_type();
  }
  write_rank_part(tmp, 0, stage(state, model_dtype));
  TITAN_CHECK(commit(tmp, folder, /*world_size=*/1, step, /*timeout_s=*/0.0),
              "[titan::checkpoint::torchtitan] expected to commit '{}', got its part missing.", tmp.string());
}

std::vector<DcpEntry> torchtitan_entries(const State& state, const nlohmann::json& values, const ToTorchtitan& how) {
  const OptimizerConfig& opt = how.optimizer;
  TITAN_CHECK_VALUE(opt.name == OptimizerName::adamw || opt.name == OptimizerName::adam,
                    "[titan::checkpoint::torchtitan] expected optimizer.name AdamW or Adam (torchtitan's optimizers), "
                    "got Muon. Give the run's optimizer settings (--job.config_file).");
  const int64_t step = values.contains("train_state") ? values.at("train_state").at("step").get<int64_t>() : 0;
  std::vector<DcpEntry> out;
  std::vector<std::string> optimized;  // parameters with optimizer state, in order
  for (const auto& st : state.tensors) {
    const std::string group = group_of(st.key), rest = st.key.substr(group.size() + 1);
    if (group == "model") {
      out.push_back({.path = {rest}, .tensor = rows_to(how.halves, rest, st.tensor)});
      if (how.tied && rest == "tok_embeddings.weight") out.push_back({.path = {"output.weight"}, .tensor = st.tensor});
    } else if (group == "moe") {  // torchtitan's expert_bias buffer, in its model state dict
      out.push_back({.path = {rest}, .tensor = st.tensor});
    } else if (group == "optimizer") {
      const std::string name = rest.substr(rest.rfind('.') + 1), fqn = rest.substr(0, rest.rfind('.'));
      TITAN_CHECK_VALUE(
          std::find(kTorchtitanAdamStates.begin(), kTorchtitanAdamStates.end(), name) != kTorchtitanAdamStates.end(),
          "[titan::checkpoint::torchtitan] expected AdamW state (exp_avg, exp_avg_sq, step), got '{}'. "
          "torchtitan has no optimizer that reads it; export the weights alone (titan-convert to-hf).",
          st.key);
      out.push_back({.path = {"optimizer", fmt::format("state.{}.{}", fqn, name)},
                     .tensor = rows_to(how.halves, fqn, st.tensor)});
      if (optimized.empty() || optimized.back() != fqn) optimized.push_back(fqn);
    } else if (group == "lora") {
      TITAN_CHECK_VALUE(false,
                        "[titan::checkpoint::torchtitan] expected no LoRA adapters, got '{}'. torchtitan's models have "
                        "none: fold them into the weights (titan-convert to-hf --adapters merge) instead.",
                        st.key);
    }
    // train_state.rng_cpu and other titan-only state: torchtitan has no place for them.
  }
  // torch's flattened param_groups: every key of the one group, under each parameter; foreach and fused as
  // torchtitan's build_optimizers passes them.
  const bool fused = opt.implementation == OptimizerImplementation::fused;
  const bool foreach = opt.implementation == OptimizerImplementation::foreach;
  const double lr = opt.lr * how.lr_factor;
  for (const std::string& fqn : optimized) {
    const std::vector<std::pair<const char*, PyRef>> group = {
        {"lr", py_float(lr)},
        {"betas", py_tuple({py_float(opt.beta1), py_float(opt.beta2)})},
        {"eps", py_float(opt.eps)},
        {"weight_decay", py_float(opt.weight_decay)},
        {"amsgrad", py_bool(false)},
        {"maximize", py_bool(false)},
        {"foreach", py_bool(foreach)},
        {"capturable", py_bool(false)},
        {"differentiable", py_bool(false)},
        {"fused", py_bool(fused)},
        {"decoupled_weight_decay", py_bool(opt.name == OptimizerName::adamw)},
        {"initial_lr", py_float(opt.lr)}};
    for (const auto& [key, value] : group)
      out.push_back({.path = {"optimizer", fmt::format("param_groups.{}.{}", fqn, key)}, .object = value});
  }
  // LambdaLR.state_dict() after `step` scheduler steps, the keys torchtitan's checkpoint holds.
  const std::vector<std::pair<const char*, PyRef>> scheduler = {{"base_lrs", py_list({py_float(opt.lr)})},
                                                                {"last_epoch", py_int(step)},
                                                                {"_step_count", py_int(step + 1)},
                                                                {"_is_initial", py_bool(false)},
                                                                {"_get_lr_called_within_step", py_bool(false)},
                                                                {"_last_lr", py_list({py_float(lr)})}};
  for (const auto& [key, value] : scheduler) out.push_back({.path = {"lr_scheduler", key}, .object = value});
  out.push_back({.path = {"train_state", "step"}, .object = py_int(step)});
  out.push_back({.path = {"train_state", "ntokens_seen"}, .object = py_int(step * how.tokens_per_step)});
  return out;
}

}  // namespace titan::checkpoint
