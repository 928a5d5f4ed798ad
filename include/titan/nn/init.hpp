// SPDX-License-Identifier: BSD-3-Clause
// Weight initialisers with a counter-based generator: element i of a parameter draws from
// hash(seed, parameter stream, i), where i is the element's position in the *global* (unsharded)
// tensor. A rank that holds a shard fills only its shard, and every layout (one device, FSDP 4,
// TP 2, ...) gets bit-identical initial weights from the seed alone, with no seed checkpoint and no
// full-size temporary. Streams are handed out in call order, so init code must call in the same
// order on every rank (model code does).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace titan::nn {

/// Seeds the init generator of the calling thread and restarts its stream counter.
void manual_init_seed(uint64_t seed);

/// Skips n streams, as n init calls would take: a model part that lacks some modules of the whole
/// model skips theirs, so the modules it holds get exactly the whole model's values.
void skip_init_streams(int64_t n);

/// In-place truncated normal N(mean, std) cut at the absolute bounds [a, b] (torch.nn.init
/// semantics: a and b are NOT in units of std), by inverse-CDF sampling like PyTorch's.
void trunc_normal_(at::Tensor& t, double mean, double std, double a, double b);

/// In-place N(mean, std) (Box-Muller on two counter-based uniforms per element).
void normal_(at::Tensor& t, double mean, double std);

namespace detail {
/// Uniform [0, 1) doubles for t's local elements (the valid, unpadded region), shape = that region;
/// with row_count >= 0 only rows [row_begin, row_begin + row_count) of it.
at::Tensor counter_uniform(const at::Tensor& t, uint64_t stream, int64_t draws_per_element, int64_t row_begin = 0,
                           int64_t row_count = -1);
/// Takes the next stream of the calling thread.
uint64_t next_init_stream();
/// Writes values (the local valid region) into t, zeroing any padding rows.
void write_local(at::Tensor& t, const at::Tensor& values);
}  // namespace detail

}  // namespace titan::nn
