// SPDX-License-Identifier: BSD-3-Clause
// titan's CUDA float8 cast kernels (sm_89/90/100): amax -> scale -> saturated cast, tensorwise
// (an amax kernel, then a cast kernel that derives the scale itself) and rowwise (one block per row:
// amax, scale and cast in one pass), plus the transposed casts through a shared-memory tile. The
// arithmetic is reference::cast's (float32 product, NaN-propagating clamp, c10's fp32 -> fp8
// conversion), so results equal the CPU kernels' bit for bit.
#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

#include "float8_cast.hpp"
#include "titan/float8/detail/scale.hpp"

namespace titan::float8::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;     // transposed casts: kTile x kTile tiles
constexpr int kTileRows = 8;  // threads per tile column (each handles kTile / kTileRows rows)
constexpr int kMaxBlocks = 4096;

struct E4M3FN {
  static constexpr float kMax = 448.0f;
  __device__ static uint8_t code(float v) { return c10::Float8_e4m3fn(v).x; }
};
struct E5M2 {
  static constexpr float kMax = 57344.0f;
  __device__ static uint8_t code(float v) { return c10::Float8_e5m2(v).x; }
};

__device__ inline float nan_max(float a, float b) { return (isnan(a) || a > b) ? a : b; }
__device__ inline float clamp_nan(float y, float max) { return y < -max ? -max : (y > max ? max : y); }

template <class F>
__device__ inline uint8_t cast_one(float x, float scale) {
  return F::code(clamp_nan(x * scale, F::kMax));
}

/// The block's NaN-propagating max of v (every thread gets it).
__device__ float block_max(float v) {
  __shared__ float warp_max[32];
  for (int offset = 16; offset > 0; offset /= 2) v = nan_max(v, __shfl_down_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>((blockDim.x + 31) / 32) ? warp_max[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v = nan_max(v, __shfl_down_sync(0xffffffffu, v, offset));
    if (lane == 0) warp_max[0] = v;
  }
  __syncthreads();
  const float result = warp_max[0];
  __syncthreads();  // warp_max may be reused by the caller's next block_max
  return result;
}

/// Non-negative floats (and positive NaN) order like their bits: atomicMax on the bits is a float max
/// that keeps NaN.
__device__ inline void atomic_amax(float* target, float v) {
  atomicMax(reinterpret_cast<unsigned int*>(target), __float_as_uint(v));
}

template <class T>
__global__ void amax_kernel(const T* x, int64_t n, float* amax) {
  float m = 0.0f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    m = nan_max(m, fabsf(static_cast<float>(x[i])));
  }
  m = block_max(m);
  if (threadIdx.x == 0) atomic_amax(amax, m);
}

template <class F, class T>
__global__ void tensorwise_kernel(const T* x, int64_t n, const float* amax, bool pow2, uint8_t* out, float* scale) {
  const float s = scale_of_amax(*amax, F::kMax, pow2);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = cast_one<F>(static_cast<float>(x[i]), s);
  }
}

/// One block per row: the row's amax, its scale, then its cast (the second read hits L1/L2).
template <class F, class T>
__global__ void rowwise_kernel(const T* x, int64_t R, int64_t C, bool pow2, uint8_t* out, float* scale) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* row = x + r * C;
    float m = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) m = nan_max(m, fabsf(static_cast<float>(row[c])));
    const float s = scale_of_amax(block_max(m), F::kMax, pow2);
    if (threadIdx.x == 0) scale[r] = s;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[r * C + c] = cast_one<F>(static_cast<float>(row[c]), s);
  }
}

/// amax of each column of x (R, C): block (kTile, kTileRows) over a column tile and a slice of rows.
template <class T>
__global__ void column_amax_kernel(const T* x, int64_t R, int64_t C, float* amax) {
  __shared__ float partial[kTileRows][kTile];
  const int64_t c = blockIdx.x * int64_t{kTile} + threadIdx.x;
  float m = 0.0f;
  if (c < C) {
    for (int64_t r = blockIdx.y * int64_t{kTileRows} + threadIdx.y; r < R; r += int64_t{gridDim.y} * kTileRows) {
      m = nan_max(m, fabsf(static_cast<float>(x[r * C + c])));
    }
  }
  partial[threadIdx.y][threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 1; k < kTileRows; ++k) m = nan_max(m, partial[k][threadIdx.x]);
    atomic_amax(amax + c, m);
  }
}

/// out (C, R) = fp8(x^T * scale) through a kTile x kTile shared tile; amax is one value, or one per
/// column of x (kPerColumn). Scales are written by the blocks of the first row tile.
template <class F, bool kPerColumn, class T>
__global__ void transposed_kernel(const T* x, int64_t R, int64_t C, const float* amax, bool pow2, uint8_t* out,
                                  float* scale) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int64_t c0 = blockIdx.x * int64_t{kTile};
  const int64_t r0 = blockIdx.y * int64_t{kTile};
  const int64_t c = c0 + threadIdx.x;
  const float s = scale_of_amax(kPerColumn ? (c < C ? amax[c] : 0.0f) : amax[0], F::kMax, pow2);
  if (blockIdx.y == 0 && threadIdx.y == 0 && (kPerColumn ? c < C : (blockIdx.x == 0 && threadIdx.x == 0))) {
    scale[kPerColumn ? c : 0] = s;
  }
  for (int k = threadIdx.y; k < kTile; k += kTileRows) {
    const int64_t r = r0 + k;
    if (r < R && c < C) tile[k][threadIdx.x] = cast_one<F>(static_cast<float>(x[r * C + c]), s);
  }
  __syncthreads();
  for (int k = threadIdx.y; k < kTile; k += kTileRows) {
    const int64_t oc = c0 + k;              // output row = column of x
    const int64_t orow = r0 + threadIdx.x;  // output column = row of x
    if (oc < C && orow < R) out[oc * R + orow] = tile[threadIdx.x][k];
  }
}

int blocks_for(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

template <class F, class T>
void launch(const CastArgs& a, bool rowwise, bool transposed, float* amax, cudaStream_t stream) {
  const auto* x = static_cast<const T*>(a.x);
  const int64_t n = a.rows * a.cols;
  const dim3 tile_block(kTile, kTileRows);
  const dim3 tile_grid(static_cast<unsigned>((a.cols + kTile - 1) / kTile),
                       static_cast<unsigned>((a.rows + kTile - 1) / kTile));
  if (rowwise && !transposed) {
    rowwise_kernel<F, T><<<static_cast<int>(std::min<int64_t>(a.rows, 65535)), kThreads, 0, stream>>>(
        x, a.rows, a.cols, a.power_of_2, a.out, a.scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  if (rowwise) {
    const dim3 grid(tile_grid.x, static_cast<unsigned>(std::clamp<int64_t>(a.rows / (kTileRows * 16), 1, 1024)));
    column_amax_kernel<T><<<grid, tile_block, 0, stream>>>(x, a.rows, a.cols, amax);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    transposed_kernel<F, true, T>
        <<<tile_grid, tile_block, 0, stream>>>(x, a.rows, a.cols, amax, a.power_of_2, a.out, a.scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  amax_kernel<T><<<blocks_for(n / 4), kThreads, 0, stream>>>(x, n, amax);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (transposed) {
    transposed_kernel<F, false, T>
        <<<tile_grid, tile_block, 0, stream>>>(x, a.rows, a.cols, amax, a.power_of_2, a.out, a.scale);
  } else {
    tensorwise_kernel<F, T><<<blocks_for(n), kThreads, 0, stream>>>(x, n, amax, a.power_of_2, a.out, a.scale);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <class F>
void launch_source(const CastArgs& a, bool rowwise, bool transposed, float* amax, cudaStream_t stream) {
  switch (a.source) {
    case Source::kFloat:
      return launch<F, float>(a, rowwise, transposed, amax, stream);
    case Source::kBFloat16:
      return launch<F, c10::BFloat16>(a, rowwise, transposed, amax, stream);
    case Source::kHalf:
      return launch<F, c10::Half>(a, rowwise, transposed, amax, stream);
  }
}

}  // namespace

void launch_cuda_cast(const CastArgs& args, bool rowwise, bool transposed, float* amax, cudaStream_t stream) {
  if (args.target == Target::kE5M2) {
    launch_source<E5M2>(args, rowwise, transposed, amax, stream);
  } else {
    launch_source<E4M3FN>(args, rowwise, transposed, amax, stream);
  }
}

}  // namespace titan::float8::detail
