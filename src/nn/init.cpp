// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/init.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <numbers>

#include "titan/layout/sharded_param.hpp"

namespace titan::nn {
namespace {

thread_local uint64_t thread_seed = 0;

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// SplitMix64's finaliser: a bijective 64-bit mix, good enough for a counter-based stream.
uint64_t mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

double norm_cdf(double x) { return (1.0 + std::erf(x / std::sqrt(2.0))) / 2.0; }

struct Region {
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offset;
  std::vector<int64_t> local_shape;
};

Region region_of(const at::Tensor& t) {
  if (const parallel::ShardedParam* sp = parallel::sharded_param(t))
    return {sp->global_shape, sp->offset, sp->local_shape};
  return {t.sizes().vec(), std::vector<int64_t>(static_cast<size_t>(t.dim()), 0), t.sizes().vec()};
}

}  // namespace

void manual_init_seed(uint64_t seed) { thread_seed = seed; }

uint64_t init_seed() { return thread_seed; }

InitSite InitSite::operator/(std::string_view child) const {
  return InitSite(seed_, name_.empty() ? std::string(child) : name_ + "." + std::string(child));
}

uint64_t InitSite::stream() const {
  // FNV-1a over the name, then mixed: names that differ in one character get unrelated streams.
  uint64_t h = 0xCBF29CE484222325ULL;
  for (const char c : name_) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ULL;
  return mix(h);
}

namespace detail {

at::Tensor counter_uniform(const at::Tensor& t, uint64_t seed, uint64_t stream, int64_t draws, int64_t row_begin,
                           int64_t row_count) {
  Region r = region_of(t);
  if (!r.local_shape.empty() && row_count >= 0) {
    r.offset[0] += row_begin;
    r.local_shape[0] = row_count;
  }
  const uint64_t key = mix(seed ^ mix(stream * kGolden + 1));
  std::vector<int64_t> with_draws = r.local_shape;
  with_draws.push_back(draws);
  at::Tensor out = at::empty(with_draws, at::TensorOptions().dtype(at::kDouble));  // (local region..., draws)
  const int64_t dims = static_cast<int64_t>(r.local_shape.size());
  const int64_t last = dims == 0 ? 1 : r.local_shape.back();
  const int64_t rows = last == 0 ? 0 : out.numel() / (last * draws);
  // Global strides, for the global linear index of each local row's first element.
  std::vector<int64_t> gstride(static_cast<size_t>(dims), 1);
  for (int64_t d = dims - 2; d >= 0; --d) gstride[d] = gstride[d + 1] * r.global_shape[d + 1];
  double* data = out.data_ptr<double>();
  at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> idx(static_cast<size_t>(std::max<int64_t>(dims - 1, 0)));
    for (int64_t row = begin; row < end; ++row) {
      int64_t rest = row, global = 0;
      for (int64_t d = dims - 2; d >= 0; --d) {
        const int64_t i = rest % r.local_shape[d];
        rest /= r.local_shape[d];
        global += (r.offset[d] + i) * gstride[d];
      }
      if (dims > 0) global += r.offset[dims - 1];
      double* dst = data + row * last * draws;
      for (int64_t j = 0; j < last; ++j) {
        for (int64_t k = 0; k < draws; ++k) {
          const uint64_t counter = static_cast<uint64_t>((global + j) * draws + k);
          dst[j * draws + k] = static_cast<double>(mix(key + counter * kGolden) >> 11) * 0x1.0p-53;
        }
      }
    }
  });
  return out;
}

void write_local(at::Tensor& t, const at::Tensor& values) {
  at::NoGradGuard no_grad;
  if (values.sizes() == t.sizes()) {
    t.copy_(values);
    return;
  }
  t.zero_();
  t.narrow(0, 0, values.size(0)).copy_(values);
}

}  // namespace detail

namespace {

// Writes transform(uniforms) over t's local region a slab of dim-0 rows at a time: the double
// temporaries stay a few x kSlabElements x 8 bytes however large t is (a 128k-vocabulary
// embedding would otherwise take ~10 GB of them). Every element's value depends only on its global
// position, so slabs give the same bits as one piece.
template <typename Transform>
void fill_local(at::Tensor& t, const InitSite& site, int64_t draws, Transform transform) {
  constexpr int64_t kSlabElements = int64_t{1} << 20;
  at::NoGradGuard no_grad;
  const uint64_t seed = site.seed();
  const uint64_t stream = site.stream();
  const Region r = region_of(t);
  const int64_t rows = r.local_shape.empty() ? 0 : r.local_shape[0];
  const int64_t row_numel = rows == 0 ? 0 : c10::multiply_integers(r.local_shape) / rows;
  const int64_t slab = std::max<int64_t>(1, kSlabElements / std::max<int64_t>(1, row_numel * draws));
  if (rows <= slab) {
    detail::write_local(t, transform(detail::counter_uniform(t, seed, stream, draws)));
    return;
  }
  if (t.size(0) > rows) t.narrow(0, rows, t.size(0) - rows).zero_();  // padding rows of a dim-0 shard
  for (int64_t begin = 0; begin < rows; begin += slab) {
    const int64_t count = std::min(slab, rows - begin);
    t.narrow(0, begin, count).copy_(transform(detail::counter_uniform(t, seed, stream, draws, begin, count)));
  }
}

}  // namespace

void trunc_normal_(at::Tensor& t, const InitSite& site, double mean, double std, double a, double b) {
  const double l = norm_cdf((a - mean) / std);
  const double u = norm_cdf((b - mean) / std);
  fill_local(t, site, 1, [&](const at::Tensor& uniform) {  // uniform: (rows..., 1)
    at::Tensor v = uniform.squeeze(-1);
    // PyTorch's recipe: uniform on [2l-1, 2u-1], erfinv, scale, shift, clamp.
    v.mul_(2 * u - 2 * l).add_(2 * l - 1);
    return v.erfinv_().mul_(std * std::sqrt(2.0)).add_(mean).clamp_(a, b);
  });
}

void normal_(at::Tensor& t, const InitSite& site, double mean, double std) {
  fill_local(t, site, 2, [&](const at::Tensor& uv) {  // uv: (rows..., 2)
    const at::Tensor radius = at::sqrt(-2.0 * at::log1p(-uv.select(-1, 0)));
    const at::Tensor angle = uv.select(-1, 1) * (2.0 * std::numbers::pi);
    return radius * at::cos(angle) * std + mean;
  });
}

void uniform_(at::Tensor& t, const InitSite& site, double low, double high) {
  fill_local(t, site, 1, [&](const at::Tensor& uniform) {  // uniform: (rows..., 1)
    return uniform.squeeze(-1).mul_(high - low).add_(low);
  });
}

void constant_(at::Tensor& t, double value) {
  at::NoGradGuard no_grad;
  const Region r = region_of(t);
  if (r.local_shape.empty() || t.size(0) == r.local_shape[0]) {
    t.fill_(value);
    return;
  }
  t.zero_();  // padding rows of a dim-0 shard
  t.narrow(0, 0, r.local_shape[0]).fill_(value);
}

void zeros_(at::Tensor& t) { constant_(t, 0.0); }

void ones_(at::Tensor& t) { constant_(t, 1.0); }

}  // namespace titan::nn
