// SPDX-License-Identifier: BSD-3-Clause
#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <numbers>

#include "alloc_tracker.hpp"
#include "titan/nn/init.hpp"

namespace {

using titan::nn::detail::counter_uniform;

// The unslabbed formulas, on the whole region at once: what init computed before it worked in slabs.
at::Tensor whole_normal(const at::Tensor& like, const titan::nn::InitSite& site, double mean, double std) {
  const at::Tensor uv = counter_uniform(like, site.seed(), site.stream(), 2);  // (rows, cols, 2) double
  const at::Tensor radius = at::sqrt(-2.0 * at::log1p(-uv.select(-1, 0)));
  return (radius * at::cos(uv.select(-1, 1) * (2.0 * std::numbers::pi)) * std + mean).to(like.scalar_type());
}

at::Tensor whole_trunc_normal(const at::Tensor& like, const titan::nn::InitSite& site, double std, double cut) {
  const double l = (1.0 + std::erf(-cut / std / std::sqrt(2.0))) / 2.0;
  const double u = (1.0 + std::erf(cut / std / std::sqrt(2.0))) / 2.0;
  at::Tensor v = counter_uniform(like, site.seed(), site.stream(), 1).squeeze(-1);  // (rows, cols) double
  v.mul_(2 * u - 2 * l).add_(2 * l - 1);
  return v.erfinv_().mul_(std * std::sqrt(2.0)).clamp_(-cut, cut).to(like.scalar_type());
}

}  // namespace

TEST_CASE("init of a large tensor works in slabs with the bits of one piece", "[nn][init]") {
  // 4100 x 2048 floats: 9 slabs for trunc_normal_ (512 rows, the last of 4), 17 for normal_ (256 rows).
  at::Tensor a = at::empty({4100, 2048});  // (rows, cols)
  at::Tensor b = at::empty({4100, 2048});  // (rows, cols)
  const titan::nn::InitSite site(11);
  int64_t peak = 0;
  {
    titan::test::TrackAllocations track;
    titan::nn::normal_(a, site / "a", 0.5, 2.0);
    titan::nn::trunc_normal_(b, site / "b", 0.0, 0.02, -0.06, 0.06);
    peak = track.stats().peak;
  }
  CHECK(at::equal(a, whole_normal(a, site / "a", 0.5, 2.0)));
  CHECK(at::equal(b, whole_trunc_normal(b, site / "b", 0.02, 0.06)));
  // One piece would hold (rows x cols x 2) doubles and three more like them: ~400 MB here (~10 GB
  // for a 128k x 2048 embedding). Slabs keep the transient memory to a few x 2^20 doubles.
  const int64_t whole_uniforms = a.numel() * 2 * 8;
  INFO("peak transient bytes " << peak << ", one piece's uniforms alone " << whole_uniforms);
  CHECK(peak < whole_uniforms / 4);
  CHECK(peak <= 6 * (int64_t{1} << 20) * 8);
}
