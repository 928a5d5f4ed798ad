// SPDX-License-Identifier: BSD-3-Clause
// Rotary position embeddings, Llama layout: the head dim is read as adjacent pairs (x[2i], x[2i+1])
// rotated by angle t * f_i, computed in fp32. Llama 3.1 frequency scaling is applied when enabled;
// YaRN (DeepSeek-V3's context extension) gives its own frequencies to the same tables.
// (Hugging Face stores q/k weights in the rotate-half layout; the HF adapter permutes them.)
#pragma once

#include <ATen/core/Tensor.h>

namespace titan::nn {

struct RopeConfig {
  /// Per-head dimension (must be even).
  int64_t head_dim = 128;
  /// Number of positions the cos/sin tables cover.
  int64_t max_positions = 2048;
  /// Base of the geometric frequency progression.
  double theta = 500000.0;
  /// Apply Llama 3.1 scaling of low frequencies (torchtitan always does for Llama 3).
  bool llama3_scaling = true;
  /// Llama 3.1 scaling: divisor applied to the lowest frequencies.
  double scaling_factor = 8.0;
  /// Llama 3.1 scaling: wavelengths above original_max_positions/low_freq_factor are scaled.
  double low_freq_factor = 1.0;
  /// Llama 3.1 scaling: wavelengths below original_max_positions/high_freq_factor are kept.
  double high_freq_factor = 4.0;
  /// Llama 3.1 scaling: the pre-training context length the scaling is relative to.
  double original_max_positions = 8192.0;
};

/// The per-pair rotation frequencies f_i, i < head_dim/2, float32, after optional scaling.
at::Tensor rope_frequencies(const RopeConfig& config);  // (HD/2)

/// The rotations e^{i t f_i} as complex numbers (torchtitan's freqs_cis): one complex multiply per
/// pair is a single kernel, fewer passes over q and k than separate cos/sin arithmetic.
struct RopeTables {
  at::Tensor freqs_cis;  // (max_positions, HD/2) complex64
};
RopeTables make_rope_tables(const RopeConfig& config, const at::Device& device);
/// The tables of given frequencies (HD/2) over max_positions positions, every rotation scaled by
/// `magnitude` (Hugging Face YaRN's attention_factor on cos and sin; 1 = a pure rotation).
RopeTables make_rope_tables(const at::Tensor& frequencies, int64_t max_positions, const at::Device& device,
                            double magnitude = 1.0);

/// YaRN (torchtitan's DeepSeek-V3 precompute_freqs_cis, and gpt-oss's without truncation): pairs that turn more than
/// beta_fast times over the original context keep their frequency, those that turn fewer than beta_slow times are
/// divided by factor, and a linear ramp over the pair index blends the two between.
struct YarnConfig {
  /// Rotated dimensions per head (even).
  int64_t head_dim = 64;
  /// Base of the geometric frequency progression.
  double theta = 10000.0;
  /// Context extension factor: the divisor of the lowest frequencies.
  double factor = 40.0;
  /// The pre-training context length the extension is relative to.
  int64_t original_max_positions = 4096;
  /// Pairs turning more often than this over the original context keep their frequency.
  double beta_fast = 32.0;
  /// Pairs turning less often than this are fully interpolated (divided by factor).
  double beta_slow = 1.0;
  /// Round the ramp's ends out to whole pairs (DeepSeek-V3, HF's default); gpt-oss keeps them fractional.
  bool truncate = true;
};
/// The YaRN frequencies, float32, in torchtitan's arithmetic.
at::Tensor yarn_frequencies(const YarnConfig& config);  // (HD/2)
/// YaRN's attention temperature 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1); the softmax
/// scale is multiplied by its square.
double yarn_mscale(double factor, double mscale);

/// Rotates x (B, S, H, HD) by `positions` ((S) or (B, S) int64: per-document positions, or a
/// context-parallel rank's global ones), or by the first S positions when undefined; returns x's dtype.
at::Tensor apply_rope(const at::Tensor& x, const RopeTables& tables, const at::Tensor& positions = {});

}  // namespace titan::nn
