// SPDX-License-Identifier: BSD-3-Clause
// Built without CUDA: NCCL groups are an error that says how to get them.
#include "../../dist/store_impl.hpp"
#include "titan/core/error.hpp"

namespace titan::dist::detail {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int64_t, int64_t,
                                                    std::chrono::milliseconds) {
  TITAN_CHECK_NOT_IMPLEMENTED(false,
                              "[titan::dist] expected a titan built with CUDA for the NCCL backend, got a CPU-only "
                              "build. Reconfigure with -DTITAN_ENABLE_CUDA=ON on a machine with nvcc.");
  return {};
}

}  // namespace titan::dist::detail
