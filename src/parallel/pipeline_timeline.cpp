// SPDX-License-Identifier: BSD-3-Clause
// Timelines of a pipeline program (simulated or measured): the bubble, and three renderings: text
// for logs and the titan-pp-schedule tool, SVG for docs, JSON for a run's folder.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "../core/xml.hpp"
#include "pipeline_internal.hpp"

namespace titan::parallel {
namespace {

using Op = PipelineAction::Op;

struct Span {
  double start = std::numeric_limits<double>::infinity();
  double end = -std::numeric_limits<double>::infinity();
  double busy = 0;
  bool empty() const { return end < start; }
};

// Busy time is each rank's union of action intervals: DualPipeV's overlapped F/B pairs run at once, and
// counting both would make a rank busier than the wall clock.
Span span_of(const PipelineTimeline& timeline) {
  Span span;
  for (const auto& rank : timeline) {
    std::vector<std::pair<double, double>> intervals;
    for (const TimedAction& t : rank) {
      span.start = std::min(span.start, t.start);
      span.end = std::max(span.end, t.end);
      intervals.emplace_back(t.start, t.end);
    }
    std::sort(intervals.begin(), intervals.end());
    double covered_to = -std::numeric_limits<double>::infinity();
    for (const auto& [start, end] : intervals) {
      if (end <= covered_to) continue;
      span.busy += end - std::max(start, covered_to);
      covered_to = end;
    }
  }
  return span;
}

/// Whether any rank runs more than one stage (then cells carry the stage: "2F0").
bool multi_stage(const PipelineTimeline& timeline) {
  for (const auto& rank : timeline) {
    for (const TimedAction& t : rank) {
      if (t.action.stage != rank.front().action.stage) return true;
    }
  }
  return false;
}

std::string label(const PipelineAction& a, bool with_stage) {
  const std::string full = format_as(a);
  if (with_stage) return full;
  size_t i = 0;
  while (i < full.size() && std::isdigit(static_cast<unsigned char>(full[i]))) ++i;
  return full.substr(i);
}

std::string_view colour(Op op) {
  switch (op) {
    case Op::kForward:
      return "#4c78a8";
    case Op::kBackward:
      return "#54a24b";
    case Op::kBackwardInput:
      return "#f58518";
    case Op::kBackwardWeight:
      return "#b279a2";
    default:
      return "#bab0ac";
  }
}

}  // namespace

double bubble_fraction(const PipelineTimeline& timeline) {
  const Span span = span_of(timeline);
  if (span.empty() || timeline.empty() || span.end <= span.start) return 0;
  return 1.0 - span.busy / (static_cast<double>(timeline.size()) * (span.end - span.start));
}

std::string render_timeline_text(const PipelineTimeline& timeline) {
  const Span span = span_of(timeline);
  if (span.empty()) return "(empty timeline)\n";
  // One column per time quantum: the shortest action, coarsened so a row stays under 400 columns
  // (measured timelines have no common unit).
  double quantum = std::numeric_limits<double>::infinity();
  for (const auto& rank : timeline) {
    for (const TimedAction& t : rank) {
      if (t.end > t.start) quantum = std::min(quantum, t.end - t.start);
    }
  }
  if (!std::isfinite(quantum)) quantum = 1;
  quantum = std::max(quantum, (span.end - span.start) / 400);
  const auto columns = static_cast<size_t>(std::ceil((span.end - span.start) / quantum - 1e-9));
  const bool with_stage = multi_stage(timeline);
  size_t width = 1;
  for (const auto& rank : timeline) {
    for (const TimedAction& t : rank) width = std::max(width, label(t.action, with_stage).size());
  }
  std::string out;
  for (size_t r = 0; r < timeline.size(); ++r) {
    std::vector<std::string> cells(columns, std::string("."));
    for (const TimedAction& t : timeline[r]) {
      const auto first = static_cast<size_t>(std::llround((t.start - span.start) / quantum));
      const auto last = std::max(first + 1, static_cast<size_t>(std::llround((t.end - span.start) / quantum)));
      for (size_t c = first; c < last && c < columns; ++c) cells[c] = c == first ? label(t.action, with_stage) : "-";
    }
    std::string row = fmt::format("rank {:<2}|", r);
    for (const std::string& cell : cells) row += fmt::format(" {:<{}}", cell, width);
    out += row.substr(0, row.find_last_not_of(' ') + 1) + '\n';
  }
  return out;
}

std::string render_timeline_svg(const PipelineTimeline& timeline, std::string_view title) {
  const Span span = span_of(timeline);
  const double length = span.empty() ? 1 : std::max(span.end - span.start, 1e-12);
  constexpr double kLeft = 70, kTop = 40, kRow = 28, kWidth = 1000;
  const double scale = kWidth / length;
  const bool with_stage = multi_stage(timeline);
  const double height = kTop + kRow * static_cast<double>(timeline.size()) + 40;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"monospace\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"20\" font-size=\"14\">{} (bubble {:.1f}%)</text>\n",
      kLeft + kWidth + 20, height, kLeft, titan::detail::xml_escape(title), 100 * bubble_fraction(timeline));
  for (size_t r = 0; r < timeline.size(); ++r) {
    const double y = kTop + kRow * static_cast<double>(r);
    out += fmt::format("<text x=\"5\" y=\"{}\">rank {}</text>\n", y + kRow * 0.6, r);
    for (const TimedAction& t : timeline[r]) {
      const double x = kLeft + (t.start - span.start) * scale;
      const double w = std::max((t.end - t.start) * scale, 0.5);
      out += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" stroke=\"white\"><title>{} "
          "[{:.6g}, {:.6g}]</title></rect>\n",
          x, y, w, kRow - 4, colour(t.action.op), format_as(t.action), t.start, t.end);
      // Labels only where they fit.
      const std::string text = label(t.action, with_stage);
      if (w >= 7.0 * static_cast<double>(text.size())) {
        out += fmt::format("<text x=\"{:.2f}\" y=\"{}\" fill=\"white\">{}</text>\n", x + 2, y + kRow * 0.55, text);
      }
    }
  }
  const double legend_y = kTop + kRow * static_cast<double>(timeline.size()) + 20;
  double x = kLeft;
  for (const auto& [op, name] :
       {std::pair{Op::kForward, "forward"}, std::pair{Op::kBackward, "backward"},
        std::pair{Op::kBackwardInput, "input grad (I)"}, std::pair{Op::kBackwardWeight, "weight grad (W)"}}) {
    out += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n", x,
        legend_y - 10, colour(op), x + 16, legend_y, name);
    x += 150;
  }
  out += "</svg>\n";
  return out;
}

std::string timeline_json(const PipelineTimeline& timeline) {
  std::string out = "{\"ranks\": [";
  for (size_t r = 0; r < timeline.size(); ++r) {
    out += r ? ",\n  [" : "\n  [";
    for (size_t i = 0; i < timeline[r].size(); ++i) {
      const TimedAction& t = timeline[r][i];
      out += fmt::format("{}{{\"action\": \"{}\", \"start\": {}, \"end\": {}}}", i ? ", " : "", format_as(t.action),
                         t.start, t.end);
    }
    out += "]";
  }
  out += timeline.empty() ? "]}\n" : "\n]}\n";
  return out;
}

}  // namespace titan::parallel
