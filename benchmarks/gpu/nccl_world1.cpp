// SPDX-License-Identifier: BSD-3-Clause
// NCCL smoke test for a machine with one GPU (NCCL refuses two ranks on one device, so multi-rank
// correctness is proven on CPU/Gloo; this proves titan's NCCL path): a one-rank NCCL group runs every
// collective titan uses on CUDA tensors (all-reduce in fp32 and bf16, all-gather, reduce-scatter, all-to-all
// with even and with explicit splits, broadcast, and point-to-point as a batch of a send to itself and the
// receive of it, which NCCL allows inside one group) and checks the results. Exit 0 = all good. Run:
//   build/bin/nccl_world1
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "titan/core/error.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/dist/store.hpp"

int main() {
  using namespace titan;
  try {
    TITAN_CHECK(at::hasCUDA(), "[nccl_world1] expected a CUDA device, got none. Run it on the GPU machine.");
    const dist::ProcessGroup group = dist::ProcessGroup::create("world", dist::Store::in_memory(), 0, 1, {0},
                                                                {.backend = "nccl", .backend_for_single_rank = true});
    const auto cuda = at::TensorOptions().device(at::kCUDA, 0).dtype(at::kFloat);
    at::Tensor x = at::arange(8, cuda);  // (8)
    group.all_reduce(x).wait();
    at::Tensor gathered = at::empty({8}, cuda);
    group.all_gather(gathered, x).wait();
    at::Tensor scattered = at::empty({8}, cuda);
    group.reduce_scatter(scattered, gathered).wait();
    at::Tensor bf16 = at::ones({4}, cuda.dtype(at::kBFloat16));
    group.all_reduce(bf16, dist::ReduceOp::kAvg).wait();
    const at::Tensor rows = at::arange(12, cuda).reshape({6, 2});  // (6, 2): expert parallelism's token rows
    at::Tensor exchanged = at::empty({6, 2}, cuda);
    group.all_to_all(exchanged, rows).wait();
    at::Tensor exchanged_splits = at::empty({6, 2}, cuda);
    group.all_to_all(exchanged_splits, rows, /*out_splits=*/{6}, /*in_splits=*/{6}).wait();
    at::Tensor broadcast = at::full({5}, 3.0, cuda);
    group.broadcast(broadcast, /*root=*/0).wait();
    const at::Tensor message = at::arange(16, cuda);  // (16)
    at::Tensor received = at::zeros({16}, cuda);      // (16)
    group
        .batch_isend_irecv(
            {{.send = true, .tensor = message, .peer = 0}, {.send = false, .tensor = received, .peer = 0}})
        .wait();
    const bool ok = at::equal(x.cpu(), at::arange(8, at::kFloat)) && at::equal(gathered.cpu(), x.cpu()) &&
                    at::equal(scattered.cpu(), x.cpu()) && at::equal(bf16.cpu().to(at::kFloat), at::ones({4})) &&
                    at::equal(exchanged.cpu(), rows.cpu()) && at::equal(exchanged_splits.cpu(), rows.cpu()) &&
                    at::equal(broadcast.cpu(), at::full({5}, 3.0)) && at::equal(received.cpu(), message.cpu()) &&
                    group.device() == at::Device(at::kCUDA, 0);
    fmt::print(
        "nccl_world1: all_reduce, all_gather, reduce_scatter, bf16 avg, all_to_all (even and split), broadcast, "
        "batch_isend_irecv on {}: "
        "{} ({} bytes counted)\n",
        at::Device(at::kCUDA, 0).str(), ok ? "OK" : "MISMATCH", group.stats().total());
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "nccl_world1: {}\n", error_message(e));
    return 1;
  }
}
