// SPDX-License-Identifier: BSD-3-Clause
#include "titan/eval/metrics.hpp"

#include <cmath>
#include <map>
#include <numbers>

#include "titan/core/error.hpp"

namespace titan::eval {
namespace {

// Python's str.isspace() code points, which re's \s matches in a str pattern.
bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The code points of UTF-8 text (invalid bytes count as one each, as U+FFFD would).
std::vector<uint32_t> code_points(std::string_view text) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    const int extra = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : 0;
    uint32_t c = extra == 0 ? b : b & (0x3F >> extra);
    size_t j = 1;
    for (; j <= static_cast<size_t>(extra) && i + j < text.size(); ++j)
      c = (c << 6) | (static_cast<unsigned char>(text[i + j]) & 0x3F);
    out.push_back(c);
    i += j;
  }
  return out;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (const double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// lm-eval's mean_stderr: sample standard deviation / sqrt(n).
double stderr_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean(v);
  double ss = 0;
  for (const double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / static_cast<double>(v.size() - 1)) / std::sqrt(static_cast<double>(v.size()));
}

void add_mean(Metrics& out, const std::string& name, const std::vector<double>& values) {
  out.emplace_back(name, mean(values));
  out.emplace_back(name + "_stderr", stderr_of(values));
}

}  // namespace

int64_t count_chars(std::string_view text) { return static_cast<int64_t>(code_points(text).size()); }

int64_t count_words(std::string_view text) {
  int64_t pieces = 1;
  bool in_space = false;
  for (const uint32_t c : code_points(text)) {
    if (is_space(c) && !in_space) ++pieces;
    in_space = is_space(c);
  }
  return pieces;
}

int64_t predicted_choice(const Doc& doc, const std::vector<Score>& responses, std::string_view metric) {
  TITAN_CHECK(responses.size() == doc.choices.size(), "[titan::eval] expected a score per choice ({}), got {}.",
              doc.choices.size(), responses.size());
  int64_t best = 0;
  double best_value = -INFINITY;
  for (size_t i = 0; i < doc.choices.size(); ++i) {
    double value = responses[i].loglikelihood;
    if (metric == "acc_norm") value /= static_cast<double>(count_chars(doc.choices[i]));
    if (metric == "acc_bytes") value /= static_cast<double>(doc.choices[i].size());
    if (value > best_value) {
      best_value = value;
      best = static_cast<int64_t>(i);
    }
  }
  return best;
}

Metrics doc_metrics(const Task& task, const Doc& doc, const std::vector<Score>& responses) {
  Metrics out;
  for (const std::string& metric : task.metrics) {
    if (task.output_type == OutputType::multiple_choice) {
      out.emplace_back(metric, predicted_choice(doc, responses, metric) == doc.gold ? 1.0 : 0.0);
    } else if (task.output_type == OutputType::loglikelihood && metric == "acc") {
      out.emplace_back(metric, responses.at(0).greedy ? 1.0 : 0.0);
    }
  }
  return out;
}

Metrics task_metrics(const Task& task, const std::vector<DocScores>& docs) {
  TITAN_CHECK(docs.size() == task.docs.size(), "[titan::eval] expected scores for {} documents, got {}.",
              task.docs.size(), docs.size());
  Metrics out;
  double ll = 0, words = 0, bytes = 0, tokens = 0;
  std::vector<double> lls;
  std::map<std::string, std::vector<double>> per_doc;
  for (size_t d = 0; d < docs.size(); ++d) {
    for (const Score& s : docs[d].responses) {
      ll += s.loglikelihood;
      lls.push_back(s.loglikelihood);
      tokens += static_cast<double>(s.tokens);
    }
    for (const auto& [metric, value] : doc_metrics(task, task.docs[d], docs[d].responses))
      per_doc[metric].push_back(value);
    words += static_cast<double>(count_words(task.docs[d].target));
    bytes += static_cast<double>(task.docs[d].target.size());
  }
  for (const std::string& metric : task.metrics) {
    if (per_doc.contains(metric)) {
      add_mean(out, metric, per_doc.at(metric));
    } else if (metric == "perplexity") {
      out.emplace_back(metric, std::exp(-mean(lls)));
    } else if (metric == "word_perplexity") {
      out.emplace_back(metric, std::exp(-ll / words));
    } else if (metric == "byte_perplexity") {
      out.emplace_back(metric, std::exp(-ll / bytes));
    } else if (metric == "bits_per_byte") {
      out.emplace_back(metric, -ll / bytes / std::numbers::ln2);
    } else if (metric == "token_perplexity") {
      out.emplace_back(metric, std::exp(-ll / tokens));
    }
  }
  return out;
}

}  // namespace titan::eval
