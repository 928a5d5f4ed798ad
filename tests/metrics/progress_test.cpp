// SPDX-License-Identifier: BSD-3-Clause
// Progress and ETA in the console line: pure formatting of given numbers (no clocks in the test).
#include "test_util.hpp"
#include "titan/metrics/metrics.hpp"

TEST_CASE("ETA durations: seconds then minutes with seconds under 10 minutes then rounded units", "[metrics]") {
  CHECK(titan::format_duration(0) == "0s");
  CHECK(titan::format_duration(-3) == "0s");
  CHECK(titan::format_duration(45.4) == "45s");
  CHECK(titan::format_duration(59.6) == "1m00s");
  CHECK(titan::format_duration(245) == "4m05s");
  CHECK(titan::format_duration(600) == "10m");
  CHECK(titan::format_duration(14 * 60 + 29) == "14m");
  CHECK(titan::format_duration(14 * 60 + 30) == "15m");
  CHECK(titan::format_duration(3599) == "1h00m");
  CHECK(titan::format_duration(2 * 3600 + 5 * 60) == "2h05m");
  CHECK(titan::format_duration(3 * 86400 + 4 * 3600) == "3d04h");
}

TEST_CASE("progress field: step of total and ETA with the step as wide as the total", "[metrics]") {
  CHECK(titan::format_progress(120, 2000, 14 * 60) == "step:  120/2000 \u00b7 ETA 14m");
  CHECK(titan::format_progress(2000, 2000, 0) == "step: 2000/2000 \u00b7 ETA 0s");
  CHECK(titan::format_progress(7, 20, 13) == "step:   7/20 \u00b7 ETA 13s");
  CHECK(titan::format_progress(7, 0, 0) == "step:   7");  // total unknown: torchtitan's field
}

TEST_CASE("console line: the progress field leads the fixed fields", "[metrics]") {
  const titan::MetricsProcessor metrics({.color = false});
  titan::StepMetrics m;
  m.step = 120;
  m.loss = 3.25;
  m.total_steps = 2000;
  m.eta_seconds = 14 * 60;
  CHECK_THAT(metrics.format_line(m), Catch::StartsWith("step:  120/2000 \u00b7 ETA 14m  loss:  3.25000  grad_norm:"));
}
