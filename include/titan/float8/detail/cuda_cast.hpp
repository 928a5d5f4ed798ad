// SPDX-License-Identifier: BSD-3-Clause
// The CUDA side of float8::cast, compiled from src/cuda/float8_cast.cu when titan is built with CUDA;
// without CUDA, src/cuda/no_cuda/float8_cast.cpp throws. No CUDA types cross this line.
#pragma once

#include "titan/float8/cast.hpp"

namespace titan::float8::detail {

/// float8::cast (transposed = false) or float8::cast_transposed (true) of a CUDA tensor x (R, C).
Float8Tensor cuda_cast(const at::Tensor& x, const CastSpec& spec, bool transposed);

}  // namespace titan::float8::detail
