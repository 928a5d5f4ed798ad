// SPDX-License-Identifier: BSD-3-Clause
// titan-plot: two runs' metrics.jsonl (written here in the trainer's keys) drawn as PNG, read back by an
// independent decoder (tests/oracles/png_check.py: zlib + struct, every chunk's CRC checked), and as SVG
// parsed by Python's XML parser; and how read_run takes a resumed or killed run's file.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "test_util.hpp"
#include "titan/metrics/plot.hpp"

namespace fs = std::filesystem;
using Catch::Contains;

namespace {

// A run of `steps` records with the trainer's keys; `scale` sets it apart from the other run.
void write_run(const fs::path& folder, int steps, double scale) {
  fs::create_directories(folder);
  std::string text;
  for (int s = 1; s <= steps; ++s) {
    const nlohmann::json record = {{"step", s},
                                   {"loss_metrics/global_avg_loss", scale * (8 * std::exp(-s / 10.0) + 2)},
                                   {"lr", 3e-4 * std::min(1.0, s / 10.0)},
                                   {"grad_norm", scale * (1.2 + std::sin(s / 3.0))},
                                   {"throughput(tps)", 12000 * scale + 100 * std::cos(s)},
                                   {"memory/max_active(GiB)", 1.5 * scale}};
    text += record.dump() + "\n";
  }
  titan::test::write_file(folder / "metrics.jsonl", text);
}

std::string rgb(std::array<uint8_t, 3> c) { return fmt::format("{},{},{}", c[0], c[1], c[2]); }

int run_tool(const std::string& args, const fs::path& log) {
  const auto bin = titan::test::binary_dir() / "bin" / "titan-plot";
  return std::system(fmt::format("'{}' {} > '{}' 2>&1", bin.string(), args, log.string()).c_str());
}

}  // namespace

TEST_CASE("titan-plot draws two runs as a PNG an independent decoder reads", "[metrics][plot][tools][full]") {
  titan::test::TempDir dir;
  write_run(dir.path / "run_a", 30, 1.0);
  write_run(dir.path / "run_b", 20, 1.3);
  const fs::path png = dir.path / "curves.png", log = dir.path / "log.txt", result = dir.path / "png.json";
  REQUIRE(run_tool(fmt::format("'{}' '{}' -o '{}'", (dir.path / "run_a").string(), (dir.path / "run_b").string(),
                               png.string()),
                   log) == 0);
  CHECK_THAT(titan::test::read_file(log), Contains("2 run(s), 5 panel(s)"));
  const std::array<uint8_t, 3> missing{1, 2, 3};
  REQUIRE(titan::test::run_python("png_check.py", fmt::format("'{}' '{}' {} {} {}", png.string(), result.string(),
                                                              rgb(titan::plot::run_color(0)),
                                                              rgb(titan::plot::run_color(1)), rgb(missing))) == 0);
  const auto found = nlohmann::json::parse(titan::test::read_file(result));
  const titan::plot::PlotOptions defaults;
  CHECK(found.at("width") == defaults.width);
  // A legend line, then one panel per default metric.
  CHECK(found.at("height") == 28 + 5 * defaults.panel_height);
  CHECK(found.at("corner") == nlohmann::json::array({255, 255, 255}));
  // Five curves per run, two pixels wide: hundreds of pixels of each run's colour, none of a colour not drawn.
  CHECK(found.at("counts").at(0).get<int>() > 500);
  CHECK(found.at("counts").at(1).get<int>() > 500);
  CHECK(found.at("counts").at(2) == 0);
  CHECK(found.at("distinct").get<int>() >= 5);  // white, black, grid, gray labels, two runs

  // Fewer metrics make fewer panels; an unknown output kind and a missing run are errors naming them.
  REQUIRE(run_tool(fmt::format("'{}' -o '{}' --metrics loss,lr", (dir.path / "run_a").string(), png.string()), log) ==
          0);
  REQUIRE(titan::test::run_python("png_check.py", fmt::format("'{}' '{}'", png.string(), result.string())) == 0);
  CHECK(nlohmann::json::parse(titan::test::read_file(result)).at("height") == 28 + 2 * defaults.panel_height);
  CHECK(run_tool(fmt::format("'{}' -o '{}'", (dir.path / "run_a").string(), (dir.path / "x.jpg").string()), log) != 0);
  CHECK_THAT(titan::test::read_file(log), Contains("expected an output file ending in .png or .svg"));
  CHECK(run_tool(fmt::format("'{}'", (dir.path / "nowhere").string()), log) != 0);
  CHECK_THAT(titan::test::read_file(log), Contains("metrics.jsonl") && Contains("nowhere"));
}

TEST_CASE("titan-plot writes well-formed SVG with a polyline per run", "[metrics][plot][tools]") {
  titan::test::TempDir dir;
  write_run(dir.path / "run_a", 12, 1.0);
  write_run(dir.path / "b<&>", 12, 1.3);  // a name that must be escaped
  const fs::path svg = dir.path / "curves.svg", log = dir.path / "log.txt", result = dir.path / "svg.json";
  REQUIRE(run_tool(fmt::format("'{}' '{}' -o '{}' --metrics loss,grad_norm", (dir.path / "run_a").string(),
                               (dir.path / "b<&>").string(), svg.string()),
                   log) == 0);
  REQUIRE(titan::test::run_python("png_check.py", fmt::format("'{}' '{}'", svg.string(), result.string())) == 0);
  const auto found = nlohmann::json::parse(titan::test::read_file(result));
  CHECK(found.at("root") == "{http://www.w3.org/2000/svg}svg");
  CHECK(found.at("polylines") == 4);  // 2 runs x 2 panels
  const auto texts = found.at("texts");
  CHECK(std::find(texts.begin(), texts.end(), "run_a") != texts.end());
  CHECK(std::find(texts.begin(), texts.end(), "b<&>") != texts.end());
  CHECK(std::find(texts.begin(), texts.end(), "grad norm") != texts.end());
}

TEST_CASE("read_run: a resumed run's last record per step wins, a killed run's cut line is skipped",
          "[metrics][plot]") {
  titan::test::TempDir dir;
  titan::test::write_file(dir.path / "metrics.jsonl",
                          "{\"step\": 1, \"lr\": 0.1, \"loss_metrics/global_avg_loss\": 5}\n"
                          "{\"step\": 2, \"lr\": 0.2}\n"
                          "{\"step\": 2, \"validation_metrics/loss\": 4.5}\n"
                          "{\"step\": 2, \"lr\": 0.25}\n"  // resumed from step 1: step 2 again
                          "{\"step\": 3, \"lr\": 0.3, \"loss_metr");
  const titan::plot::Run run = titan::plot::read_run(dir.path);
  CHECK(run.name == dir.path.filename().string());
  REQUIRE(run.series.count("lr") == 1);
  CHECK(run.series.at("lr").steps == std::vector<double>{1, 2});
  CHECK(run.series.at("lr").values == std::vector<double>{0.1, 0.25});
  CHECK(run.series.at(titan::plot::metric_key("val_loss")).values == std::vector<double>{4.5});
  CHECK(titan::plot::metric_key("loss") == "loss_metrics/global_avg_loss");
  CHECK(titan::plot::metric_key("mfu(%)") == "mfu(%)");
  // Values a diverged run writes (huge, infinite as a string, one flat step) still draw, in bounded time.
  titan::plot::Run wild{.name = "wild", .series = {}};
  wild.series["loss_metrics/global_avg_loss"] = {.steps = {1, 2, 3}, .values = {1e308, -1e308, std::nan("")}};
  wild.series["lr"] = {.steps = {7}, .values = {0.5}};
  const titan::plot::Image image = titan::plot::render({wild}, {.metrics = {"loss", "lr"}, .width = 300});
  CHECK(image.width == 300);
  CHECK(image.rgb.size() == static_cast<size_t>(image.width * image.height * 3));
  titan::test::write_file(dir.path / "metrics.jsonl", "{\"step\": 1, \"lr\": 0.1}\nnot json\n{\"step\": 2}\n");
  CHECK_THROWS_WITH(titan::plot::read_run(dir.path), Contains("line 2") && Contains("metrics.jsonl"));
}
