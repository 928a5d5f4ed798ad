// SPDX-License-Identifier: BSD-3-Clause
// NCCL process groups (CUDA builds only). One GPU per rank: LOCAL_RANK picks the device first.
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "../dist/store_impl.hpp"

namespace titan::dist::detail {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                    int64_t size, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto backend =
      c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(rank), static_cast<int>(size), options);
  // The rank's GPU, made current by dist::select_rank_device before the mesh is built: the communicators
  // are created there, not on whatever device a first collective's tensor names.
  backend->setBoundDeviceId(at::Device(at::kCUDA, c10::cuda::current_device()));
  return backend;
}

}  // namespace titan::dist::detail
