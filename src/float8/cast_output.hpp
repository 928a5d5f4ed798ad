// SPDX-License-Identifier: BSD-3-Clause
// The tensor side of one float8 cast, shared by the CPU (cast.cpp) and CUDA (src/cuda/float8_cast.cpp)
// paths: the source as (R, C), the float8 result and its scales allocated on the source's device, and
// the raw-pointer arguments the kernels take (cast_kernels.hpp).
#pragma once

#include <ATen/ATen.h>

#include "cast_kernels.hpp"
#include "titan/float8/cast.hpp"
#include "titan/float8/detail/scale.hpp"

namespace titan::float8::detail {

/// A cast ready to run: the kernels write `data` and `scale` through `args`.
struct CastOutput {
  at::Tensor x{};      // (R, C) contiguous view of the source (a 1-row view of a tensorwise N-d source)
  at::Tensor data{};   // (R, C), or (C, R) transposed; the source's shape for a tensorwise N-d cast
  at::Tensor scale{};  // () tensorwise; (R, 1) rowwise; (C, 1) rowwise transposed
  CastArgs args{};     // pointers into x, data and scale
  bool rowwise = false;
};

inline Source source_of(at::ScalarType t) {
  if (t == at::kBFloat16) return Source::kBFloat16;
  if (t == at::kHalf) return Source::kHalf;
  return Source::kFloat;
}

/// Allocates the result of casting x_in (checked by the caller) under spec. An empty source gets the
/// scale of amax 0 here, as the kernels would give, and nothing is left to run (`x.numel() == 0`).
inline CastOutput prepare_cast(const at::Tensor& x_in, const CastSpec& spec, bool transposed) {
  CastOutput o;
  o.x = x_in.dim() == 2 ? x_in.contiguous() : x_in.contiguous().view({1, -1});  // (R, C)
  const int64_t R = o.x.size(0);
  const int64_t C = o.x.size(1);
  o.rowwise = spec.scaling == Scaling::kRowwise;
  o.data = at::empty(transposed ? at::IntArrayRef{C, R} : x_in.sizes(), o.x.options().dtype(spec.dtype));
  const int64_t scales = o.rowwise ? (transposed ? C : R) : 1;
  o.scale = at::empty(o.rowwise ? at::IntArrayRef{scales, 1} : at::IntArrayRef{}, o.x.options().dtype(at::kFloat));
  o.args = {.x = o.x.data_ptr(),
            .rows = R,
            .cols = C,
            .source = source_of(o.x.scalar_type()),
            .target = spec.dtype == at::kFloat8_e5m2 ? Target::kE5M2 : Target::kE4M3FN,
            .power_of_2 = spec.power_of_2_scales,
            .out = static_cast<uint8_t*>(o.data.data_ptr()),
            .scale = o.scale.data_ptr<float>()};
  if (o.x.numel() == 0) o.scale.fill_(scale_of_amax(0.0f, float8_max(spec.dtype), spec.power_of_2_scales));
  return o;
}

}  // namespace titan::float8::detail
