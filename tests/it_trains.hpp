// SPDX-License-Identifier: BSD-3-Clause
// "It trains", told apart from batch noise, for every test that claims a run learned.
//
// At lr 0 the weights never move, so each step's loss is one fixed model's loss on that step's batch: the
// losses scatter around one value with the batch noise sigma, step by step independently (each step draws a
// new batch). The mean of k steps then scatters by sigma/sqrt(k), and the difference of two disjoint k-step
// means by sigma*sqrt(2/k). A run trained when the mean of its first k losses exceeds the mean of its last k
// by more than kTrainsZ such sigmas. k = n/3 (at least 1) separates a steady descent best: the gap of the
// means grows with n - k, the noise bound falls with sqrt(k).
//
// sigma comes from an lr-0 run of the same job (batch_noise: the change between consecutive steps has
// variance 2 sigma^2, so sigma = rms(change)/sqrt(2)), stated beside the job and re-measured by a test of its
// own; or, without one, from the run itself by the same formula: its changes carry the batch noise and the
// descent, so in expectation that sigma is at least the lr-0 one and the check errs towards failing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace titan::test {

/// How many noise sigmas of the difference of the k-step means a run must fall by. With sigma estimated
/// from the n - 1 changes of the run, Gaussian noise at lr 0 passes less than once in 1,000 runs of 6 to 200
/// steps (the self-test "it trains: ..." in tests/train/it_trains_test.cpp counts it); 4 sigmas would let
/// 2 in 1,000 through at 8 steps.
inline constexpr double kTrainsZ = 5.0;

/// rms of the step-to-step changes of `losses`, / sqrt(2): an lr-0 run's batch noise.
inline double batch_noise(const std::vector<double>& losses) {
  TITAN_CHECK_VALUE(losses.size() >= 2, "[titan::test::batch_noise] expected at least 2 losses, got {}.",
                    losses.size());
  double sum_sq = 0;
  for (size_t i = 1; i < losses.size(); ++i) sum_sq += (losses[i] - losses[i - 1]) * (losses[i] - losses[i - 1]);
  return std::sqrt(sum_sq / static_cast<double>(losses.size() - 1) / 2.0);
}

/// The first and last k-step means of a loss curve, and the bound batch noise puts on their difference.
struct Descent {
  int64_t k = 0;       ///< steps per mean
  double first = 0;    ///< mean of the first k losses
  double last = 0;     ///< mean of the last k losses
  double noise = 0;    ///< sigma: the batch noise of one step's loss
  bool stated = true;  ///< sigma measured at lr 0 (else estimated from the run itself)
  double bound = 0;    ///< kTrainsZ * sigma * sqrt(2/k)
  bool trained() const { return first - last > bound; }
  std::string describe() const {
    std::ostringstream out;
    out << "the first " << k << " steps' mean " << first << ", the last " << k << " steps' mean " << last << ": fell "
        << first - last << "; batch noise sigma " << noise
        << (stated ? " (measured at lr 0)" : " (rms step-to-step change of the run / sqrt 2)") << " puts " << kTrainsZ
        << " sigma of the difference at " << bound;
    return out.str();
  }
};

/// The Descent of `losses` over k-step means (k = 0: n/3), with the lr-0 batch noise if known.
inline Descent descent(const std::vector<double>& losses, std::optional<double> lr0_noise = std::nullopt,
                       int64_t k = 0) {
  const auto n = static_cast<int64_t>(losses.size());
  TITAN_CHECK_VALUE(n >= 3, "[titan::test::descent] expected a loss curve of at least 3 steps, got {}.", n);
  Descent d{.k = k > 0 ? k : std::max<int64_t>(1, n / 3)};
  TITAN_CHECK_VALUE(2 * d.k <= n,
                    "[titan::test::descent] expected two disjoint {}-step windows, got {} steps. Use a smaller k.", d.k,
                    n);
  for (int64_t i = 0; i < d.k; ++i) {
    d.first += losses[static_cast<size_t>(i)] / static_cast<double>(d.k);
    d.last += losses[static_cast<size_t>(n - d.k + i)] / static_cast<double>(d.k);
  }
  d.stated = lr0_noise.has_value();
  d.noise = lr0_noise ? *lr0_noise : batch_noise(losses);
  d.bound = kTrainsZ * d.noise * std::sqrt(2.0 / static_cast<double>(d.k));
  return d;
}

/// Losses logged by step (steps 1..n, each once), in step order.
inline std::vector<double> by_step(const std::map<int64_t, double>& logged) {
  std::vector<double> losses;
  for (const auto& [step, loss] : logged) {
    TITAN_CHECK_VALUE(step == static_cast<int64_t>(losses.size()) + 1,
                      "[titan::test::by_step] expected the losses of steps 1..n, got step {} after {} steps.", step,
                      losses.size());
    losses.push_back(loss);
  }
  return losses;
}

}  // namespace titan::test

/// "It trains": the curve's last k-step mean lies below its first by more than batch noise explains
/// (titan::test::descent; optional arguments: the job's lr-0 batch noise, k).
#define CHECK_TRAINS(...)                                                              \
  do {                                                                                 \
    const ::titan::test::Descent titan_descent_ = ::titan::test::descent(__VA_ARGS__); \
    INFO("it trains? " << titan_descent_.describe());                                  \
    CHECK(titan_descent_.trained());                                                   \
  } while (0)
