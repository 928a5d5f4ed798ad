// SPDX-License-Identifier: BSD-3-Clause
#include <fmt/format.h>

#include "titan/eval/evaluator.hpp"

namespace titan::eval {

nlohmann::json result_json(const TaskResult& result, bool docs) {
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& [name, value] : result.metrics) metrics[name] = value;
  nlohmann::json out = {{"task", result.task},
                        {"output_type", output_type_name(result.output_type)},
                        {"metrics", metrics},
                        {"documents", result.docs.size()},
                        {"forwards", result.stats.forwards},
                        {"input_tokens", result.stats.input_tokens},
                        {"scored_tokens", result.stats.scored_tokens},
                        {"seconds", result.seconds},
                        {"tokens_per_second",
                         result.seconds > 0 ? static_cast<double>(result.stats.input_tokens) / result.seconds : 0.0}};
  if (docs) {
    nlohmann::json rows = nlohmann::json::array();
    for (const DocScores& doc : result.docs) {
      nlohmann::json responses = nlohmann::json::array();
      for (const Score& s : doc.responses) responses.push_back({s.loglikelihood, s.greedy, s.tokens});
      nlohmann::json values = nlohmann::json::object();
      for (const auto& [name, value] : doc.metrics) values[name] = value;
      rows.push_back({{"responses", responses}, {"metrics", values}});
    }
    out["docs"] = rows;
  }
  return out;
}

std::string format_results(const std::vector<TaskResult>& results) {
  std::string out = fmt::format("{:<24} {:<18} {:>14} {:>10}\n", "task", "metric", "value", "stderr");
  for (const TaskResult& r : results) {
    for (size_t i = 0; i < r.metrics.size(); ++i) {
      const auto& [name, value] = r.metrics[i];
      if (name.ends_with("_stderr")) continue;
      const bool has_stderr = i + 1 < r.metrics.size() && r.metrics[i + 1].first == name + "_stderr";
      out += fmt::format("{:<24} {:<18} {:>14.6g} {:>10}\n", r.task, name, value,
                         has_stderr ? fmt::format("{:.4f}", r.metrics[i + 1].second) : std::string("-"));
    }
  }
  return out;
}

}  // namespace titan::eval
