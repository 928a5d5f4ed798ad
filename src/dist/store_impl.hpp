// SPDX-License-Identifier: BSD-3-Clause
// Private: the c10d objects behind titan::dist handles (only src/dist and src/cuda see c10d).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstdint>

namespace titan::dist::detail {

struct StoreImpl {
  c10::intrusive_ptr<c10d::Store> store;
};

/// Creates an NCCL backend (src/cuda/nccl_backend.cpp); throws when titan was built without CUDA.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                    int64_t size, std::chrono::milliseconds timeout);

}  // namespace titan::dist::detail
