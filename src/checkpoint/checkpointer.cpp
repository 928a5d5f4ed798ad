// SPDX-License-Identifier: BSD-3-Clause
#include "titan/checkpoint/checkpointer.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdlib>
#include <exception>
#include <regex>
#include <thread>

#include "titan/checkpoint/hf.hpp"
#include "titan/checkpoint/peft.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/test_faults.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/layout/sharded_param.hpp"

namespace titan::checkpoint {
namespace fs = std::filesystem;

struct Checkpointer::Impl {
  CheckpointConfig config;
  fs::path root;
  const dist::Mesh& mesh;
  std::shared_ptr<const HfAdapter> hf;
  fs::path hf_tokenizer;  // the tokenizer the HF export carries (save_hf)
  double commit_timeout_s;
  // A test's pause before this rank writes its part, so it can kill the rank mid-save deterministically.
  std::chrono::milliseconds write_delay{testing::faults().checkpoint_write_delay_ms};
  std::thread writer{};  // the in-flight async save
  std::thread purger{};  // the in-flight deletion of old checkpoints (rank 0)
  std::exception_ptr error{};
  std::shared_ptr<const State> buffers{};  // the last staged state: its tensors are reused once written
  std::atomic<bool> cancel{false};

  // Deletes all but the newest keep_latest_k complete checkpoints, and temporary folders of saves
  // older than the newest complete one (left by a crash).
  void purge() const {
    if (config.keep_latest_k <= 0) return;
    int64_t kept = 0, newest = -1;
    for (const auto& [step, path] : list_steps(root)) {
      if (check_complete(path)) continue;
      if (newest < 0) newest = step;
      if (++kept > config.keep_latest_k) {
        std::error_code ec;
        fs::remove_all(path, ec);
        if (ec) log::warn("Could not delete old checkpoint {}: {}", path.string(), ec.message());
      }
    }
    static const std::regex tmp_re(R"(\.step-(\d+)\.tmp)");
    for (const auto& e : fs::directory_iterator(root)) {
      std::smatch m;
      const std::string name = e.path().filename().string();
      std::error_code ec;
      if (std::regex_match(name, m, tmp_re) && std::stoll(m[1].str()) < newest) fs::remove_all(e.path(), ec);
    }
  }

  void join() {
    if (writer.joinable()) writer.join();
    if (purger.joinable()) purger.join();
  }

  // Loads checkpoint.initial_load_path (a .safetensors file, an HF folder or a titan checkpoint) into state; the
  // loaded values when it was a whole titan checkpoint loaded as such (not model_only), else nullopt.
  std::optional<nlohmann::json> load_initial(State& state, bool model_only) const {
    const fs::path path = *config.initial_load_path;
    if (path.extension() == ".safetensors") {
      load_safetensors(SafetensorsFile(path), state);
    } else if (config.initial_load_in_hf || fs::exists(path / "config.json")) {
      TITAN_CHECK_VALUE(hf != nullptr,
                        "[titan::checkpoint::Checkpointer] expected a model with a Hugging Face adapter "
                        "to load '{}', got none.",
                        path.string());
      load_hf(path, state, *hf);
    } else {
      std::vector<std::string> exclude = config.exclude_from_loading;
      if (model_only) exclude.insert(exclude.end(), {"optimizer", "lr_scheduler", "dataloader", "train_state"});
      nlohmann::json values = checkpoint::load(path, state, exclude);
      log::info("Loaded the initial state from {}", path.string());
      if (!model_only) return values;
    }
    return std::nullopt;
  }
};

Checkpointer::Checkpointer(CheckpointConfig config, fs::path dump_folder, const dist::Mesh& mesh,
                           std::shared_ptr<const HfAdapter> hf, double commit_timeout_s, fs::path hf_tokenizer)
    : impl_(new Impl{.config = std::move(config),
                     .root = {},
                     .mesh = mesh,
                     .hf = std::move(hf),
                     .hf_tokenizer = std::move(hf_tokenizer),
                     .commit_timeout_s = commit_timeout_s}) {
  impl_->root = std::move(dump_folder) / impl_->config.folder;
}

Checkpointer::~Checkpointer() {
  // Unwinding (e.g. a peer died): a commit waiting for that peer's part would wait in vain.
  if (std::uncaught_exceptions() > 0) impl_->cancel = true;
  impl_->join();
  if (impl_->error) {
    try {
      std::rethrow_exception(impl_->error);
    } catch (const std::exception& e) {
      log::warn("The last checkpoint save failed: {}", e.what());
    }
  }
}

const fs::path& Checkpointer::root() const { return impl_->root; }

bool Checkpointer::due(int64_t step, int64_t last_step) const {
  const CheckpointConfig& c = impl_->config;
  if (!c.enable || c.load_only) return false;
  return step == last_step || step % c.interval == 0 || (step == 1 && c.enable_first_step_checkpoint);
}

void Checkpointer::wait() {
  impl_->join();
  if (impl_->error) std::rethrow_exception(std::exchange(impl_->error, nullptr));
}

void Checkpointer::save(int64_t step, const State& state, bool last) {
  wait();
  Impl& m = *impl_;
  const CheckpointConfig& c = m.config;
  const fs::path folder = m.root / fmt::format("step-{}", step);
  const bool model_only = last && c.last_save_model_only;
  const at::ScalarType dtype = model_only ? scalar_type(c.export_dtype) : at::kFloat;
  if (last && c.last_save_in_hf) {
    TITAN_CHECK_VALUE(m.hf != nullptr,
                      "[titan::checkpoint::Checkpointer] expected a model with a Hugging Face adapter for "
                      "checkpoint.last_save_in_hf, got none. Unset last_save_in_hf.");
    std::vector<std::pair<std::string, at::Tensor>> whole, adapters;
    for (const auto& st : state.tensors) {
      if (!is_model_group(st.key)) continue;
      (group_of(st.key) == "model" ? whole : adapters)
          .emplace_back(st.key.substr(st.key.find('.') + 1), parallel::full_tensor(st.tensor, m.mesh));
    }
    const char* what = "the final model";
    // PEFT records the base it adapts: the HF folder the run started from, when it did.
    const bool hf_start =
        c.initial_load_path && (c.initial_load_in_hf || fs::exists(fs::path(*c.initial_load_path) / "config.json"));
    const std::string base = hf_start ? *c.initial_load_path : std::string();
    if (m.mesh.rank() == 0) {
      if (adapters.empty()) {
        save_hf(folder, whole, *m.hf, dtype, kHfMaxShardBytes, m.hf_tokenizer);
      } else if (state.values.at("lora").value("merge_adapter", false)) {
        save_hf(folder, merge_lora(whole, adapters, lora_scale(state.values.at("lora"))), *m.hf, dtype,
                kHfMaxShardBytes, m.hf_tokenizer);
      } else {
        save_peft(folder, adapters, *m.hf,
                  {.lora = state.values.at("lora"), .dtype = dtype, .base_model = base, .tokenizer = m.hf_tokenizer});
      }
    }
    if (!adapters.empty()) {
      what = state.values.at("lora").value("merge_adapter", false) ? "the final model with its LoRA adapters merged"
                                                                   : "the final LoRA adapters as a PEFT adapter";
    }
    m.mesh.group("world").barrier();
    log::info("Saved {} in Hugging Face format ({}) to {}", what, c.export_dtype, folder.string());
    return;
  }
  State selected;
  selected.values = model_only ? nlohmann::json::object() : state.values;
  if (model_only && state.values.contains("lora")) selected.values["lora"] = state.values.at("lora");
  for (const auto& st : state.tensors) {
    if (!model_only || is_model_group(st.key)) selected.tensors.push_back(st);
  }
  const fs::path tmp = m.root / fmt::format(".step-{}.tmp", step);
  if (m.mesh.rank() == 0) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  m.mesh.group("world").barrier();  // the folder exists (and is empty) before anyone writes
  const auto start = std::chrono::steady_clock::now();
  auto staged = std::make_shared<const State>(stage(selected, dtype, m.buffers.get()));
  m.buffers = staged;
  const double stage_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t rank = m.mesh.rank(), world = m.mesh.world_size();
  const bool async = c.async_mode != AsyncMode::disabled && !last;
  auto write = [&m, tmp, folder, rank, world, step, async, staged]() {
    std::this_thread::sleep_for(m.write_delay);
    write_rank_part(tmp, rank, *staged);
    if (rank != 0) return;
    if (!commit(tmp, folder, world, step, m.commit_timeout_s, &m.cancel)) {
      log::warn(
          "Checkpoint step {} was not completed (a rank's part never arrived); {} is left incomplete and will "
          "not be loaded.",
          step, tmp.string());
      return;
    }
    if (async) {
      m.purge();  // already off the training thread
    } else {
      m.purger = std::thread([&m] { m.purge(); });
    }
  };
  if (async) {
    m.writer = std::thread([&m, write = std::move(write)] {
      try {
        write();
      } catch (...) {
        m.error = std::current_exception();
      }
    });
    log::info("Staged checkpoint step {} in {:.3f} s; writing it in the background", step, stage_s);
    return;
  }
  write();
  m.mesh.group("world").barrier();  // every rank returns once the checkpoint is complete
  log::info("Saved checkpoint step {}{} to {} in {:.3f} s", step, model_only ? " (model only)" : "", folder.string(),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

std::optional<nlohmann::json> Checkpointer::load(State& state) {
  const Impl& m = *impl_;
  const CheckpointConfig& c = m.config;
  std::optional<std::pair<int64_t, fs::path>> found;
  if (c.enable && fs::is_directory(m.root)) {
    if (c.load_step >= 0) {
      const fs::path folder = m.root / fmt::format("step-{}", c.load_step);
      const auto problem = check_complete(folder);
      TITAN_CHECK_VALUE(!problem, "[titan::checkpoint::Checkpointer] expected checkpoint.load_step {} at '{}', got {}.",
                        c.load_step, folder.string(), problem.value_or(""));
      found.emplace(c.load_step, folder);
    } else {
      for (const auto& [step, folder] : list_steps(m.root)) {
        if (const auto problem = check_complete(folder)) {
          log::warn("Skipping checkpoint {}: {}", folder.string(), *problem);
          continue;
        }
        found.emplace(step, folder);
        break;
      }
    }
  }
  if (found) {
    nlohmann::json values = checkpoint::load(found->second, state, c.exclude_from_loading);
    values["step"] = found->first;
    log::info("Loaded checkpoint {} (step {}){}", found->second.string(), found->first,
              values.at("skipped").empty() ? "" : fmt::format("; not in it: {}", values.at("skipped").dump()));
    const nlohmann::json& skipped = values.at("skipped");
    if (std::find(skipped.begin(), skipped.end(), "model") != skipped.end() && values.contains("lora") &&
        c.initial_load_path) {
      // LoRA adapters saved alone (lora.save_adapter_only): the frozen base comes from where the run started.
      State base;
      for (const StateTensor& st : state.tensors) {
        if (group_of(st.key) == "model") base.tensors.push_back(st);
      }
      m.load_initial(base, /*model_only=*/true);
      log::info("Loaded the base weights beside the adapters from {}", c.initial_load_path->c_str());
    }
    return values;
  }
  if (!c.initial_load_path) return std::nullopt;
  if (auto values = m.load_initial(state, c.initial_load_model_only)) return values;
  log::info("Loaded the initial weights from {}", c.initial_load_path->c_str());
  return nlohmann::json{{"step", 0}};
}

}  // namespace titan::checkpoint
