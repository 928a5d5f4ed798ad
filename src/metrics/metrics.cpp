// SPDX-License-Identifier: BSD-3-Clause
#include "titan/metrics/metrics.hpp"

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <string>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/metrics/detail/device_memory.hpp"
#include "titan/metrics/tensorboard.hpp"

namespace titan {
namespace {

int64_t proc_status_kib(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1));
  }
  return 0;
}

std::string with_commas(int64_t v) {
  const std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out = v < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double percent(int64_t part, int64_t whole) {
  return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

}  // namespace

std::string format_duration(double seconds) {
  const int64_t s = std::llround(std::max(seconds, 0.0));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  const int64_t m = (s + 30) / 60;  // to the nearest minute from here on
  if (m < 60) return fmt::format("{}m", m);
  if (m < 24 * 60) return fmt::format("{}h{:02}m", m / 60, m % 60);
  const int64_t h = (m + 30) / 60;
  return fmt::format("{}d{:02}h", h / 24, h % 24);
}

std::string format_progress(int64_t step, int64_t total_steps, double eta_seconds) {
  if (total_steps <= 0) return fmt::format("step: {:3}", step);
  const int width = std::max<int>(3, static_cast<int>(std::to_string(total_steps).size()));
  return fmt::format("step: {:>{}}/{} \u00b7 ETA {}", step, width, total_steps, format_duration(eta_seconds));
}

MemoryStats memory_stats(const at::Device& device) {
  if (device.is_cuda()) {
    if (auto stats = detail::cuda_memory_stats(device.index() < 0 ? 0 : device.index())) return *stats;
  }
  return MemoryStats{.max_active = proc_status_kib("VmHWM") * 1024,
                     .max_reserved = proc_status_kib("VmRSS") * 1024,
                     .capacity = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE)};
}

void reset_peak_memory(const at::Device& device) {
  if (device.is_cuda()) detail::cuda_reset_peak_memory(device.index() < 0 ? 0 : device.index());
}

MetricsProcessor::MetricsProcessor(Options options)
    : options_(std::move(options)), last_log_(std::chrono::steady_clock::now()) {
  if (!options_.jsonl_path.empty()) sinks_.push_back(std::make_unique<JsonlWriter>(options_.jsonl_path));
  if (!options_.tensorboard_folder.empty()) {
    auto tensorboard = std::make_unique<TensorBoardWriter>(options_.tensorboard_folder);
    tensorboard_ = tensorboard.get();
    sinks_.push_back(std::move(tensorboard));
  }
}

MetricsProcessor::~MetricsProcessor() = default;
MetricsProcessor::MetricsProcessor(MetricsProcessor&&) noexcept = default;
MetricsProcessor& MetricsProcessor::operator=(MetricsProcessor&&) noexcept = default;

std::optional<std::filesystem::path> MetricsProcessor::tensorboard_file() const {
  if (!tensorboard_) return std::nullopt;
  return tensorboard_->path();
}

void MetricsProcessor::add_sink(std::unique_ptr<MetricsSink> sink) {
  TITAN_CHECK(sink != nullptr, "[titan::MetricsProcessor::add_sink] expected a sink, got nullptr.");
  sinks_.push_back(std::move(sink));
}

void MetricsProcessor::write(int64_t step, const nlohmann::json& record) {
  for (const auto& sink : sinks_) sink->write(step, record);
}

void MetricsProcessor::add_step(int64_t tokens, double data_seconds) {
  for (const auto& sink : sinks_) sink->flush();
  tokens_since_log_ += tokens;
  tokens_seen_ += tokens;
  data_seconds_since_log_ += data_seconds;
  ++steps_since_log_;
}

void MetricsProcessor::add_scalar(const std::string& key, double value) { scalars_[key] = value; }

StepMetrics MetricsProcessor::log(int64_t step, double loss, double grad_norm, double lr) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - last_log_).count();
  const double steps = static_cast<double>(std::max<int64_t>(steps_since_log_, 1));
  StepMetrics m;
  m.step = step;
  m.loss = loss;
  m.grad_norm = grad_norm;
  m.lr = lr;
  // Per device: data-parallel ranks each count their own tokens; cp/tp/pp ranks share them.
  m.tps = static_cast<double>(tokens_since_log_) / (elapsed * static_cast<double>(options_.non_data_parallel_size));
  m.tflops = static_cast<double>(options_.flops_per_token) * m.tps / 1e12;
  m.mfu =
      options_.peak_flops > 0 ? 100.0 * static_cast<double>(options_.flops_per_token) * m.tps / options_.peak_flops : 0;
  m.step_time = elapsed / steps;
  m.data_time = data_seconds_since_log_ / steps;
  m.data_pct = elapsed > 0 ? 100.0 * data_seconds_since_log_ / elapsed : 0;
  m.tokens_seen = tokens_seen_;
  m.memory = memory_stats(options_.device);
  if (options_.memory_parts) m.parts = options_.memory_parts();
  m.total_steps = options_.total_steps;
  if (first_log_ && step > first_log_->first) {
    const double since_first = std::chrono::duration<double>(now - first_log_->second).count();
    m.eta_seconds =
        since_first / static_cast<double>(step - first_log_->first) * static_cast<double>(m.total_steps - step);
  } else {
    m.eta_seconds = m.step_time * static_cast<double>(m.total_steps - step);
  }
  if (!first_log_) first_log_.emplace(step, now);
  log::info("{}", format_line(m));
  if (!sinks_.empty()) {
    nlohmann::json record = {
        {"step", m.step},
        {"loss_metrics/global_avg_loss", m.loss},
        {"grad_norm", m.grad_norm},
        {"lr", m.lr},
        {"throughput(tps)", m.tps},
        {"tflops", m.tflops},
        {"mfu(%)", m.mfu},
        {"time_metrics/end_to_end(s)", m.step_time},
        {"time_metrics/data_loading(s)", m.data_time},
        {"time_metrics/data_loading(%)", m.data_pct},
        {"memory/max_active(GiB)", static_cast<double>(m.memory.max_active) / kGiB},
        {"memory/max_active(%)", percent(m.memory.max_active, m.memory.capacity)},
        {"memory/max_reserved(GiB)", static_cast<double>(m.memory.max_reserved) / kGiB},
        {"memory/max_reserved(%)", percent(m.memory.max_reserved, m.memory.capacity)},
        {"memory/num_alloc_retries", m.memory.num_alloc_retries},
        {"memory/num_ooms", m.memory.num_ooms},
        {"n_tokens_seen", m.tokens_seen},
    };
    if (m.parts) {
      // Per rank, by part (docs/training.md#metrics): parameters, gradients and optimizer state are the tensors'
      // bytes; activations and communication the peaks since the last log.
      record["memory/parameters(GiB)"] = static_cast<double>(m.parts->parameters) / kGiB;
      record["memory/gradients(GiB)"] = static_cast<double>(m.parts->gradients) / kGiB;
      record["memory/optimizer(GiB)"] = static_cast<double>(m.parts->optimizer) / kGiB;
      record["memory/activations(GiB)"] = static_cast<double>(m.parts->activations) / kGiB;
      record["memory/communication(GiB)"] = static_cast<double>(m.parts->communication) / kGiB;
    }
    for (const auto& [key, value] : scalars_) record[key] = value;
    write(step, record);
  }
  scalars_.clear();
  if (m.memory.num_alloc_retries > 0 || m.memory.num_ooms > 0) {
    log::warn("{} CUDA allocation retries and {} OOMs so far", m.memory.num_alloc_retries, m.memory.num_ooms);
  }
  reset_peak_memory(options_.device);
  tokens_since_log_ = 0;
  steps_since_log_ = 0;
  data_seconds_since_log_ = 0;
  last_log_ = std::chrono::steady_clock::now();
  return m;
}

std::string MetricsProcessor::format_line(const StepMetrics& m) const {
  // torchtitan's palette: red step, green loss, orange grad_norm, turquoise memory, blue tps,
  // cyan tflops, magenta mfu.
  const bool c = options_.color;
  const auto paint = [c](const char* code, const std::string& text) {
    return c ? fmt::format("\033[{}m{}\033[39m", code, text) : text;
  };
  const double mem_gib = static_cast<double>(m.memory.max_active) / kGiB;
  const double mem_pct = percent(m.memory.max_active, m.memory.capacity);
  return fmt::format(
      "{}  {}  {}  {}  {}  {}  {}  {}  {}", paint("31", format_progress(m.step, m.total_steps, m.eta_seconds)),
      paint("32", fmt::format("loss: {:8.5f}", m.loss)),
      paint("38;2;180;60;0", fmt::format("grad_norm: {:7.4f}", m.grad_norm)), fmt::format("lr: {:.3e}", m.lr),
      paint("38;2;54;234;195", fmt::format("memory: {:5.2f}GiB({:.2f}%)", mem_gib, mem_pct)),
      paint("34", fmt::format("tps: {}", with_commas(std::llround(m.tps)))),
      paint("36", fmt::format("tflops: {:.3f}", m.tflops)), paint("35", fmt::format("mfu: {:.2f}%", m.mfu)),
      fmt::format("step_time: {:.3f}s data: {:.1f}%", m.step_time, m.data_pct));
}

void MetricsProcessor::log_validation(int64_t step, double loss, int64_t tokens) {
  const double perplexity = std::exp(loss);
  log::info("validate step {:>5}  loss {:8.4f}  perplexity {:10.3f}  tokens {}", step, loss, perplexity, tokens);
  const nlohmann::json record = {{"step", step},
                                 {"validation_metrics/loss", loss},
                                 {"validation_metrics/perplexity", perplexity},
                                 {"validation_metrics/tokens", tokens}};
  write(step, record);
}

void MetricsProcessor::log_record(int64_t step, std::string_view title,
                                  const std::vector<std::pair<std::string, double>>& values) {
  nlohmann::json record = {{"step", step}};
  std::string line;
  for (const auto& [key, value] : values) {
    record[key] = value;
    line += fmt::format("  {} {:.6g}", key, value);
  }
  log::info("{} step {:>5}{}", title, step, line);
  write(step, record);
}

}  // namespace titan
