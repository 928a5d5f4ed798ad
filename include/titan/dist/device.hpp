// SPDX-License-Identifier: BSD-3-Clause
// The device a rank trains on: one GPU per rank, picked by LOCAL_RANK (torchrun, srun and titan-run set
// it) and made the current CUDA device before any CUDA work, so cuBLAS handles, NCCL communicators and
// tensors made on "cuda" without an index land on the rank's own GPU instead of GPU 0.
//
//   const at::Device device = titan::dist::select_rank_device(env.local_rank);  // cuda:<LOCAL_RANK> or cpu
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace titan::dist {

/// The CUDA index of LOCAL_RANK `local_rank` among `visible_gpus` (-1: none visible, the CPU). More ranks on
/// a node than GPUs is an error naming both: NCCL refuses two ranks on one GPU.
int64_t rank_device_index(int64_t local_rank, int64_t visible_gpus);

/// cuda:<rank_device_index> made current, or the CPU when no GPU is visible.
at::Device select_rank_device(int64_t local_rank);

}  // namespace titan::dist
