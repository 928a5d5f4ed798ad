// SPDX-License-Identifier: BSD-3-Clause
// Training curves (plot.hpp). The figure is laid out once as a list of shapes (rectangles, lines,
// polylines, text), then either rasterized (Bresenham lines two pixels wide, the 5x7 font of
// plot_font.cpp, a PNG of zlib-compressed rows) or written as SVG, so both outputs show the same thing.
#include "titan/metrics/plot.hpp"

#include <fmt/format.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>

#include "../core/xml.hpp"
#include "plot_font.hpp"
#include "titan/core/error.hpp"

namespace titan::plot {
namespace fs = std::filesystem;
namespace {

using Color = std::array<uint8_t, 3>;
constexpr Color kWhite{255, 255, 255}, kBlack{0, 0, 0}, kGrid{225, 225, 225}, kGray{110, 110, 110};

// Short names, their metrics.jsonl keys (src/metrics/metrics.cpp) and panel titles.
struct Known {
  const char* name = "";
  const char* key = "";
  const char* title = "";
};
constexpr Known kKnown[] = {
    {"loss", "loss_metrics/global_avg_loss", "loss"},
    {"lr", "lr", "learning rate"},
    {"grad_norm", "grad_norm", "grad norm"},
    {"tps", "throughput(tps)", "tokens/s per device"},
    {"memory", "memory/max_active(GiB)", "memory: max active (GiB)"},
    {"mfu", "mfu(%)", "MFU (%)"},
    {"tflops", "tflops", "TFLOPs per device"},
    {"val_loss", "validation_metrics/loss", "validation loss"},
};

std::string title_of(const std::string& name) {
  for (const Known& k : kKnown) {
    if (name == k.name) return k.title;
  }
  return name;
}

// ---- the figure as shapes ----------------------------------------------------------------------------

enum class Align { kLeft, kCenter, kRight };

struct Rect {
  int x = 0, y = 0, w = 0, h = 0;
};
struct Shape {
  enum class Kind { kFill, kLine, kPolyline, kText } kind = Kind::kFill;
  Color color{};
  Rect rect{};                                   // kFill; the clip of kPolyline
  std::vector<std::pair<double, double>> pts{};  // kLine (2 points), kPolyline
  int width = 1;                                 // line width in pixels
  std::string text{};                            // kText at pts[0] (top edge), aligned by align
  Align align = Align::kLeft;
};

struct Figure {
  int width = 0, height = 0;
  std::vector<Shape> shapes{};
  void fill(Rect r, Color c) { shapes.push_back({.kind = Shape::Kind::kFill, .color = c, .rect = r}); }
  void line(double x0, double y0, double x1, double y1, Color c) {
    shapes.push_back({.kind = Shape::Kind::kLine, .color = c, .pts = {{x0, y0}, {x1, y1}}});
  }
  void text(double x, double y, std::string s, Color c, Align a = Align::kLeft) {
    shapes.push_back({.kind = Shape::Kind::kText, .color = c, .pts = {{x, y}}, .text = std::move(s), .align = a});
  }
};

// About `target` round tick values (1, 2 or 5 times a power of ten apart, at least min_step) inside [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target, double min_step = 0) {
  const double raw = std::max((hi - lo) / target, min_step);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / magnitude;
  const double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * magnitude;
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step); k * step <= hi + step * 1e-9 && ticks.size() < 50; k += 1) {
    const double v = k * step;
    ticks.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  }
  return ticks;
}

std::string tick_label(double v) { return fmt::format("{:.6g}", v); }

// [lo, hi] of the finite values, widened when empty or flat.
std::pair<double, double> range_of(const std::vector<const std::vector<double>*>& all, double pad) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto* values : all) {
    for (double v : *values) {
      if (std::isfinite(v)) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
    }
  }
  if (!std::isfinite(lo)) return {0.0, 1.0};
  if (hi - lo <= std::abs(hi) * 1e-12) {
    const double d = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
    return {lo - d, hi + d};
  }
  const double margin = (hi - lo) * pad;
  return {lo - margin, hi + margin};
}

constexpr int kLegendRow = 18;  // pixels per legend line
constexpr int kLeft = 78, kRight = 24, kTop = 22, kBottom = 30;

Figure layout(const std::vector<Run>& runs, const PlotOptions& options) {
  TITAN_CHECK_VALUE(
      options.width >= 240 && options.width <= 20000 && options.panel_height >= 120 && options.panel_height <= 20000,
      "[titan::plot] expected a width in [240, 20000] and a panel height in [120, 20000] pixels, got "
      "{} and {}.",
      options.width, options.panel_height);
  TITAN_CHECK_VALUE(!options.metrics.empty() && options.metrics.size() <= 64,
                    "[titan::plot] expected 1 to 64 metrics to plot, got {}. Pass --metrics loss,lr,...",
                    options.metrics.size());
  Figure fig;
  fig.width = options.width;
  // The legend: a swatch and the name of each run, wrapped to the width.
  std::vector<std::pair<int, int>> legend_at;  // (x, row) of each run
  int x = kLeft, row = 0;
  for (const Run& run : runs) {
    const int w = 24 + static_cast<int>(run.name.size()) * detail::kGlyphAdvance + 18;
    if (x + w > options.width - kRight && x > kLeft) {
      x = kLeft;
      ++row;
    }
    legend_at.emplace_back(x, row);
    x += w;
  }
  const int legend_height = 10 + (row + 1) * kLegendRow;
  fig.height = legend_height + static_cast<int>(options.metrics.size()) * options.panel_height;
  fig.fill({0, 0, fig.width, fig.height}, kWhite);
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto [lx, lrow] = legend_at[i];
    const int ly = 8 + lrow * kLegendRow;
    fig.fill({lx, ly + 2, 18, 3}, run_color(i));
    fig.text(lx + 24, ly, runs[i].name, kBlack);
  }
  for (size_t p = 0; p < options.metrics.size(); ++p) {
    const std::string& name = options.metrics[p];
    const std::string key = metric_key(name);
    const int y0 = legend_height + static_cast<int>(p) * options.panel_height;
    const Rect area{kLeft, y0 + kTop, options.width - kLeft - kRight, options.panel_height - kTop - kBottom};
    fig.text(kLeft, y0 + 6, title_of(name), kBlack);
    if (key != title_of(name)) {
      fig.text(area.x + area.w, y0 + 6, key, kGray, Align::kRight);
    }
    std::vector<const std::vector<double>*> xs, ys;
    for (const Run& run : runs) {
      const auto it = run.series.find(key);
      if (it == run.series.end() || it->second.steps.empty()) continue;
      xs.push_back(&it->second.steps);
      ys.push_back(&it->second.values);
    }
    const auto [xlo, xhi] = range_of(xs, 0.0);
    const auto [ylo, yhi] = range_of(ys, 0.05);
    const auto px = [&, xlo = xlo, xhi = xhi](double v) { return area.x + (v - xlo) / (xhi - xlo) * (area.w - 1); };
    const auto py = [&, ylo = ylo, yhi = yhi](double v) {
      return area.y + area.h - 1 - (v - ylo) / (yhi - ylo) * (area.h - 1);
    };
    // Grid and tick labels, then the curves, then the axes on top.
    for (double t : nice_ticks(ylo, yhi, 5)) {
      const double y = std::round(py(t));
      fig.line(area.x, y, area.x + area.w - 1, y, kGrid);
      fig.text(area.x - 6, y - 3, tick_label(t), kBlack, Align::kRight);
    }
    for (double t : nice_ticks(xlo, xhi, 8, /*min_step=*/1)) {  // steps are whole numbers
      const double xx = std::round(px(t));
      fig.line(xx, area.y, xx, area.y + area.h - 1, kGrid);
      fig.text(xx, area.y + area.h + 5, tick_label(t), kBlack, Align::kCenter);
    }
    fig.text(area.x + area.w, area.y + area.h + 16, "step", kGray, Align::kRight);
    if (xs.empty()) fig.text(area.x + area.w / 2.0, area.y + area.h / 2.0 - 3, "no data", kGray, Align::kCenter);
    for (size_t r = 0; r < runs.size(); ++r) {
      const auto it = runs[r].series.find(key);
      if (it == runs[r].series.end()) continue;
      Shape curve{.kind = Shape::Kind::kPolyline, .color = run_color(r), .rect = area, .width = 2};
      const Series& s = it->second;
      for (size_t i = 0; i < s.steps.size(); ++i) {
        const double x = px(s.steps[i]), y = py(s.values[i]);
        if (std::isfinite(x) && std::isfinite(y)) curve.pts.emplace_back(x, y);
      }
      fig.shapes.push_back(std::move(curve));
    }
    fig.line(area.x, area.y, area.x, area.y + area.h - 1, kBlack);
    fig.line(area.x, area.y + area.h - 1, area.x + area.w - 1, area.y + area.h - 1, kBlack);
  }
  return fig;
}

// ---- raster ------------------------------------------------------------------------------------------

struct Canvas {
  Image& img;
  Rect clip;
  void set(int x, int y, Color c) const {
    if (x < clip.x || y < clip.y || x >= clip.x + clip.w || y >= clip.y + clip.h) return;
    uint8_t* p =
        img.rgb.data() + (static_cast<size_t>(y) * static_cast<size_t>(img.width) + static_cast<size_t>(x)) * 3;
    p[0] = c[0];
    p[1] = c[1];
    p[2] = c[2];
  }
  // Bresenham from (x0, y0) to (x1, y1), each pixel stamped width x width.
  void line(double fx0, double fy0, double fx1, double fy1, Color c, int width) const {
    // Endpoints clamped far outside the image keep the loop short for wild values.
    if (!std::isfinite(fx0) || !std::isfinite(fy0) || !std::isfinite(fx1) || !std::isfinite(fy1)) return;
    const auto clamp = [](double v) { return static_cast<int>(std::lround(std::clamp(v, -1e5, 1e5))); };
    int x0 = clamp(fx0), y0 = clamp(fy0);
    const int x1 = clamp(fx1), y1 = clamp(fy1);
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    while (true) {
      for (int i = 0; i < width; ++i) {
        for (int j = 0; j < width; ++j) set(x0 + i, y0 + j, c);
      }
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) {
        err += dy;
        x0 += sx;
      }
      if (e2 <= dx) {
        err += dx;
        y0 += sy;
      }
    }
  }
  void text(double fx, double fy, const std::string& s, Color c, Align align) const {
    if (!std::isfinite(fx) || !std::isfinite(fy)) return;
    const int w = static_cast<int>(s.size()) * detail::kGlyphAdvance - 1;
    int x = static_cast<int>(std::lround(fx));
    if (align == Align::kRight) x -= w;
    if (align == Align::kCenter) x -= w / 2;
    const int y = static_cast<int>(std::lround(fy));
    for (char ch : s) {
      for (int row = 0; row < detail::kGlyphHeight; ++row) {
        for (int col = 0; col < detail::kGlyphWidth; ++col) {
          if (detail::glyph_pixel(ch, col, row)) set(x + col, y + row, c);
        }
      }
      x += detail::kGlyphAdvance;
    }
  }
};

Image rasterize(const Figure& fig) {
  Image img{.width = fig.width, .height = fig.height, .rgb = {}};
  img.rgb.assign(static_cast<size_t>(fig.width) * static_cast<size_t>(fig.height) * 3, 255);
  const Rect whole{0, 0, fig.width, fig.height};
  for (const Shape& s : fig.shapes) {
    switch (s.kind) {
      case Shape::Kind::kFill: {
        const Canvas canvas{img, whole};
        for (int y = s.rect.y; y < s.rect.y + s.rect.h; ++y) {
          for (int x = s.rect.x; x < s.rect.x + s.rect.w; ++x) canvas.set(x, y, s.color);
        }
        break;
      }
      case Shape::Kind::kLine:
        Canvas{img, whole}.line(s.pts[0].first, s.pts[0].second, s.pts[1].first, s.pts[1].second, s.color, s.width);
        break;
      case Shape::Kind::kPolyline: {
        const Canvas canvas{img, s.rect};
        if (s.pts.size() == 1)
          canvas.line(s.pts[0].first - 1, s.pts[0].second - 1, s.pts[0].first - 1, s.pts[0].second - 1, s.color,
                      3);  // one point: a dot
        for (size_t i = 1; i < s.pts.size(); ++i) {
          canvas.line(s.pts[i - 1].first, s.pts[i - 1].second, s.pts[i].first, s.pts[i].second, s.color, s.width);
        }
        break;
      }
      case Shape::Kind::kText:
        Canvas{img, whole}.text(s.pts[0].first, s.pts[0].second, s.text, s.color, s.align);
        break;
    }
  }
  return img;
}

// ---- SVG ---------------------------------------------------------------------------------------------

std::string hex(Color c) { return fmt::format("#{:02x}{:02x}{:02x}", c[0], c[1], c[2]); }

std::string svg_of(const Figure& fig) {
  std::string out = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"monospace\" font-size=\"10\">\n",
      fig.width, fig.height);
  int clip_id = 0;
  for (const Shape& s : fig.shapes) {
    switch (s.kind) {
      case Shape::Kind::kFill:
        out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n", s.rect.x, s.rect.y,
                           s.rect.w, s.rect.h, hex(s.color));
        break;
      case Shape::Kind::kLine:
        out += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\"/>\n",
                           s.pts[0].first + 0.5, s.pts[0].second + 0.5, s.pts[1].first + 0.5, s.pts[1].second + 0.5,
                           hex(s.color));
        break;
      case Shape::Kind::kPolyline: {
        if (s.pts.empty()) break;
        out += fmt::format("<clipPath id=\"c{}\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/></clipPath>\n",
                           clip_id, s.rect.x, s.rect.y, s.rect.w, s.rect.h);
        out += fmt::format(
            "<polyline clip-path=\"url(#c{})\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" "
            "stroke-linejoin=\"round\" stroke-linecap=\"round\" points=\"",
            clip_id++, hex(s.color), s.width);
        for (const auto& [x, y] : s.pts) out += fmt::format("{:.2f},{:.2f} ", x + 0.5, y + 0.5);
        out += "\"/>\n";
        break;
      }
      case Shape::Kind::kText: {
        const char* anchor = s.align == Align::kLeft ? "start" : s.align == Align::kRight ? "end" : "middle";
        out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"{}\" text-anchor=\"{}\">{}</text>\n", s.pts[0].first,
                           s.pts[0].second + detail::kGlyphHeight, hex(s.color), anchor,
                           titan::detail::xml_escape(s.text));
        break;
      }
    }
  }
  out += "</svg>\n";
  return out;
}

// ---- PNG ---------------------------------------------------------------------------------------------

void put_u32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

void put_chunk(std::string& out, const char (&type)[5], const std::string& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const std::string body = std::string(type, 4) + data;
  out += body;
  put_u32(out, static_cast<uint32_t>(
                   crc32(0L, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
}

}  // namespace

std::string metric_key(const std::string& name) {
  for (const Known& k : kKnown) {
    if (name == k.name) return k.key;
  }
  return name;
}

std::array<uint8_t, 3> run_color(size_t i) {
  // Tableau 10: distinct on white, none of them gray or black (axes and text).
  static constexpr Color kPalette[] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},   {214, 39, 40},
                                       {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {188, 189, 34},
                                       {23, 190, 207},  {127, 127, 127}};
  return kPalette[i % std::size(kPalette)];
}

Run read_run(const fs::path& folder_or_file) {
  const fs::path file = fs::is_directory(folder_or_file) ? folder_or_file / "metrics.jsonl" : folder_or_file;
  std::ifstream in(file);
  TITAN_CHECK_VALUE(in.good(),
                    "[titan::plot::read_run] expected a run folder with metrics.jsonl (the trainer writes it to "
                    "job.dump_folder with metrics.enable_jsonl), got none at '{}'.",
                    file.string());
  Run run;
  const fs::path folder = fs::is_directory(folder_or_file) ? folder_or_file : folder_or_file.parent_path();
  run.name = fs::absolute(folder).lexically_normal().filename().string();
  if (run.name.empty()) run.name = fs::absolute(folder).lexically_normal().parent_path().filename().string();
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  std::map<std::string, std::map<double, double>> points;  // key -> step -> value, the last record wins
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto record = nlohmann::json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded() && i + 1 == lines.size()) break;  // the last line of a killed run, cut short
    TITAN_CHECK_VALUE(record.is_object(),
                      "[titan::plot::read_run] expected a JSON object per line of '{}', got line {}: '{}'. Remove "
                      "the line or pass another run.",
                      file.string(), i + 1, lines[i].substr(0, 80));
    const auto step = record.find("step");
    if (step == record.end() || !step->is_number()) continue;
    for (const auto& [key, value] : record.items()) {
      if (key != "step" && value.is_number()) points[key][step->get<double>()] = value.get<double>();
    }
  }
  for (const auto& [key, by_step] : points) {
    Series& s = run.series[key];
    for (const auto& [step, value] : by_step) {
      s.steps.push_back(step);
      s.values.push_back(value);
    }
  }
  return run;
}

Image render(const std::vector<Run>& runs, const PlotOptions& options) { return rasterize(layout(runs, options)); }

std::string render_svg(const std::vector<Run>& runs, const PlotOptions& options) {
  return svg_of(layout(runs, options));
}

std::string encode_png(const Image& image) {
  TITAN_CHECK_VALUE(image.width > 0 && image.height > 0 &&
                        image.rgb.size() == static_cast<size_t>(image.width) * static_cast<size_t>(image.height) * 3,
                    "[titan::plot::encode_png] expected {} x {} x 3 bytes, got {}.", image.width, image.height,
                    image.rgb.size());
  const size_t stride = static_cast<size_t>(image.width) * 3;
  std::string raw;  // each row: filter byte 0 (none), then its pixels
  raw.reserve((stride + 1) * static_cast<size_t>(image.height));
  for (int y = 0; y < image.height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(image.rgb.data()) + static_cast<size_t>(y) * stride, stride);
  }
  uLongf packed_size = compressBound(static_cast<uLong>(raw.size()));
  std::string packed(packed_size, '\0');
  const int rc = compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size,
                           reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()), 6);
  TITAN_CHECK(rc == Z_OK, "[titan::plot::encode_png] expected zlib to compress the image, got error {}.", rc);
  packed.resize(packed_size);
  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string header;
  put_u32(header, static_cast<uint32_t>(image.width));
  put_u32(header, static_cast<uint32_t>(image.height));
  header += std::string("\x08\x02\x00\x00\x00", 5);  // 8 bits, RGB, deflate, adaptive filters, no interlace
  put_chunk(png, "IHDR", header);
  put_chunk(png, "IDAT", packed);
  put_chunk(png, "IEND", "");
  return png;
}

void write_plot(const fs::path& out, const std::vector<Run>& runs, const PlotOptions& options) {
  std::string ext = out.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  TITAN_CHECK_VALUE(ext == ".png" || ext == ".svg",
                    "[titan::plot::write_plot] expected an output file ending in .png or .svg, got '{}'.",
                    out.string());
  const std::string bytes = ext == ".png" ? encode_png(render(runs, options)) : render_svg(runs, options);
  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  std::ofstream file(out, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.flush();
  TITAN_CHECK_VALUE(file.good(), "[titan::plot::write_plot] expected to write '{}', got a write error.", out.string());
}

}  // namespace titan::plot
