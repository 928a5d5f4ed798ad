// SPDX-License-Identifier: BSD-3-Clause
// Training curves without Python: reads the metrics.jsonl of one or more runs (the trainer writes it to
// job.dump_folder) and draws one panel per metric, one colour per run, as PNG (a small encoder over zlib,
// a line rasterizer and a built-in 5x7 bitmap font) or SVG. tools/titan_plot.cpp is the command line;
// docs/observability.md#plots shows it.
//
// Example:
//   const std::vector<plot::Run> runs = {plot::read_run("outputs/a"), plot::read_run("outputs/b")};
//   plot::write_plot("curves.png", runs, plot::PlotOptions{.metrics = {"loss", "lr"}});
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace titan::plot {

/// One metric of one run: (step, value) in step order, the last record of a step winning (a resumed run
/// appends to its metrics.jsonl).
struct Series {
  std::vector<double> steps{};
  std::vector<double> values{};
};

/// A run's curves, keyed by metrics.jsonl key ("loss_metrics/global_avg_loss", "lr", ...).
struct Run {
  std::string name;                        ///< the run folder's name, shown in the legend
  std::map<std::string, Series> series{};  ///< every numeric key but "step"
};

/// The metrics.jsonl key of a short metric name (loss, lr, grad_norm, tps, memory, mfu, tflops);
/// any other name is taken as a key itself.
std::string metric_key(const std::string& name);

/// Reads <folder>/metrics.jsonl (or the .jsonl file itself). Throws naming the file and line for an
/// unparsable line other than a last one cut short by a killed run.
Run read_run(const std::filesystem::path& folder_or_file);

/// What to draw.
struct PlotOptions {
  std::vector<std::string> metrics{"loss", "lr", "grad_norm", "tps", "memory"};  ///< one panel each, top to bottom
  int width = 900;                                                               ///< pixels
  int panel_height = 260;  ///< pixels per panel, title and tick labels included
};

/// An RGB raster, row-major, 3 bytes a pixel.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb{};  // (height, width, 3)
};

/// The colour of run i (a ten-colour palette, repeating).
std::array<uint8_t, 3> run_color(size_t i);

/// Draws the panels into an image.
Image render(const std::vector<Run>& runs, const PlotOptions& options = {});
/// The same figure as an SVG document.
std::string render_svg(const std::vector<Run>& runs, const PlotOptions& options = {});
/// A PNG file's bytes (8-bit RGB, zlib-compressed rows).
std::string encode_png(const Image& image);
/// Writes the figure as PNG or SVG, chosen by out's extension (.png, .svg).
void write_plot(const std::filesystem::path& out, const std::vector<Run>& runs, const PlotOptions& options = {});

}  // namespace titan::plot
