// SPDX-License-Identifier: BSD-3-Clause
// The launcher of the CUDA float8 cast kernels (float8_cast_kernels.cu), on raw device pointers; the
// tensor side is float8_cast.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include "../float8/cast_kernels.hpp"

namespace titan::float8::detail {

/// Runs one cast on `stream`: `amax` is scratch of 1 (tensorwise) or cols (rowwise transposed)
/// floats, zeroed by the caller; out and scale as CastArgs says.
void launch_cuda_cast(const CastArgs& args, bool rowwise, bool transposed, float* amax, cudaStream_t stream);

}  // namespace titan::float8::detail
