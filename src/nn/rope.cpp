// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/rope.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "titan/core/error.hpp"

namespace titan::nn {

at::Tensor rope_frequencies(const RopeConfig& c) {
  TITAN_CHECK_VALUE(c.head_dim > 0 && c.head_dim % 2 == 0,
                    "[titan::nn::rope] expected an even head_dim, got {}. Check dim / n_heads.", c.head_dim);
  // Same float32 arithmetic as torchtitan's precompute_freqs_cis.
  const at::Tensor exponents = at::arange(0, c.head_dim, 2, at::kFloat) / static_cast<double>(c.head_dim);
  at::Tensor freqs = 1.0 / at::pow(c.theta, exponents);  // (HD/2)
  if (!c.llama3_scaling) return freqs;
  const double low_wavelen = c.original_max_positions / c.low_freq_factor;
  const double high_wavelen = c.original_max_positions / c.high_freq_factor;
  auto f = freqs.accessor<float, 1>();
  for (int64_t i = 0; i < freqs.size(0); ++i) {
    const double freq = f[i];
    const double wavelen = 2.0 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      f[i] = static_cast<float>(freq / c.scaling_factor);
    } else {
      const double smooth =
          (c.original_max_positions / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
      f[i] = static_cast<float>((1.0 - smooth) * freq / c.scaling_factor + smooth * freq);
    }
  }
  return freqs;
}

RopeTables make_rope_tables(const RopeConfig& c, const at::Device& device) {
  return make_rope_tables(rope_frequencies(c), c.max_positions, device);
}

RopeTables make_rope_tables(const at::Tensor& frequencies, int64_t max_positions, const at::Device& device,
                            double magnitude) {
  const at::Tensor t = at::arange(max_positions, at::kFloat);               // (P)
  const at::Tensor angles = at::outer(t, frequencies);                      // (P, HD/2)
  return {at::polar(at::full_like(angles, magnitude), angles).to(device)};  // (P, HD/2) complex64
}

at::Tensor yarn_frequencies(const YarnConfig& c) {
  RopeConfig plain{.head_dim = c.head_dim, .theta = c.theta, .llama3_scaling = false};
  const at::Tensor freqs = rope_frequencies(plain);  // (HD/2)
  // The pair index at which a frequency turns `turns` times over the original context.
  const auto pair_turning = [&](double turns) {
    return static_cast<double>(c.head_dim) *
           std::log(static_cast<double>(c.original_max_positions) / (turns * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(c.theta));
  };
  const double fast = pair_turning(c.beta_fast), slow = pair_turning(c.beta_slow);
  const double low = std::max(c.truncate ? std::floor(fast) : fast, 0.0);
  double high = std::min(c.truncate ? std::ceil(slow) : slow, static_cast<double>(c.head_dim - 1));
  if (low == high) high += 0.001;  // torchtitan's guard against a zero-width ramp
  const at::Tensor ramp = ((at::arange(c.head_dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);  // (HD/2)
  const at::Tensor smooth = 1 - ramp;                       // 1: keep, 0: interpolate
  return freqs / c.factor * (1 - smooth) + freqs * smooth;  // (HD/2)
}

double yarn_mscale(double factor, double mscale) { return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

at::Tensor apply_rope(const at::Tensor& x, const RopeTables& tables, const at::Tensor& positions) {
  const int64_t seq = x.size(1);
  const int64_t max_positions = tables.freqs_cis.size(0);
  at::Tensor rot;  // (S, 1, HD/2) or (B, S, 1, HD/2)
  if (!positions.defined()) {
    TITAN_CHECK_VALUE(seq <= max_positions,
                      "[titan::nn::rope] expected at most {} positions, got a sequence of {}. "
                      "Raise the model's max positions (training.seq_len).",
                      max_positions, seq);
    rot = tables.freqs_cis.narrow(0, 0, seq).unsqueeze(1);
  } else {
    TITAN_CHECK_VALUE(positions.size(-1) == seq && (positions.dim() == 1 || positions.size(0) == x.size(0)),
                      "[titan::nn::rope] expected positions (S={}) or (B={}, S={}), got {}.", seq, x.size(0), seq,
                      c10::str(positions.sizes()));
    // On CUDA index_select checks bounds on the device, without a host sync per layer.
    TITAN_CHECK_VALUE(
        !positions.device().is_cpu() || positions.numel() == 0 || positions.max().item<int64_t>() < max_positions,
        "[titan::nn::rope] expected positions below {}, got {}. Raise the model's max positions "
        "(training.seq_len).",
        max_positions, positions.max().item<int64_t>());
    const at::Tensor index = positions.to(tables.freqs_cis.device());
    rot = tables.freqs_cis.index_select(0, index.flatten()).view({-1, 1, x.size(-1) / 2});
    if (positions.dim() == 2) rot = rot.unflatten(0, {x.size(0), seq});
  }
  const int64_t half = x.size(-1) / 2;
  const at::Tensor pairs = x.to(at::kFloat).unflatten(-1, {half, 2}).contiguous();  // (B, S, H, HD/2, 2)
  const at::Tensor out = at::view_as_complex(pairs) * rot;                          // (B, S, H, HD/2)
  return at::view_as_real(out).flatten(-2).to(x.scalar_type());                     // (B, S, H, HD)
}

}  // namespace titan::nn
