// SPDX-License-Identifier: BSD-3-Clause
// Weight initialisers with a counter-based generator: element i of a parameter draws from
// hash(seed, hash(the parameter's fully qualified name), i), where i is the element's position in the
// *global* (unsharded) tensor. A rank that holds a shard fills only its shard, every layout (one
// device, FSDP 4, TP 2, pipeline stages, a user's own split) gets bit-identical initial weights from
// the seed alone, and no init code depends on the order of its calls: a parameter's values are
// fixed by its name.
//
//   const nn::InitSite site = nn::InitSite::current() / "layers.0.attention";  // the module's name
//   nn::trunc_normal_(wq->weight, site / "wq.weight", 0.0, 0.02, -2.0, 2.0);
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace titan::nn {

/// Seeds the init generator of the calling thread (what InitSite::current() carries).
void manual_init_seed(uint64_t seed);
/// The calling thread's init seed (0 until manual_init_seed).
uint64_t init_seed();

/// Where values are drawn: the init seed and a fully qualified name (of a module, or of a parameter
/// when passed to an initialiser). `site / "wq"` names a child.
class InitSite {
 public:
  explicit InitSite(uint64_t seed, std::string name = {}) : seed_(seed), name_(std::move(name)) {}
  /// The calling thread's seed, the model's root.
  static InitSite current() { return InitSite(init_seed()); }
  /// The child `child` of this name ("layers.3" / "attention" = "layers.3.attention").
  InitSite operator/(std::string_view child) const;
  uint64_t seed() const { return seed_; }
  const std::string& name() const { return name_; }
  /// The random stream of this name (a 64-bit hash of it).
  uint64_t stream() const;

 private:
  uint64_t seed_;
  std::string name_;
};

/// In-place truncated normal N(mean, std) cut at the absolute bounds [a, b] (torch.nn.init
/// semantics: a and b are NOT in units of std), by inverse-CDF sampling like PyTorch's. `site`
/// names the parameter.
void trunc_normal_(at::Tensor& t, const InitSite& site, double mean, double std, double a, double b);

/// In-place N(mean, std) (Box-Muller on two counter-based uniforms per element).
void normal_(at::Tensor& t, const InitSite& site, double mean, double std);

/// In-place U[low, high) (one counter-based uniform per element).
void uniform_(at::Tensor& t, const InitSite& site, double low, double high);
/// In-place `value` in every element this rank holds (its shard's padding rows, which are no element of the whole
/// tensor, stay zero like the random initialisers leave them): the same whole tensor on every layout, no draws.
void constant_(at::Tensor& t, double value);
/// constant_(t, 0): biases, a LayerNorm's bias.
void zeros_(at::Tensor& t);
/// constant_(t, 1): a norm's weight.
void ones_(at::Tensor& t);

namespace detail {
/// Uniform [0, 1) doubles for t's local elements (the valid, unpadded region), shape = that region;
/// with row_count >= 0 only rows [row_begin, row_begin + row_count) of it.
at::Tensor counter_uniform(const at::Tensor& t, uint64_t seed, uint64_t stream, int64_t draws_per_element,
                           int64_t row_begin = 0, int64_t row_count = -1);
/// Writes values (the local valid region) into t, zeroing any padding rows.
void write_local(at::Tensor& t, const at::Tensor& values);
}  // namespace detail

}  // namespace titan::nn
