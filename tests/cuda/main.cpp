// SPDX-License-Identifier: BSD-3-Clause
// Entry point of titan_cuda_tests, the kernel tests that need a GPU. Built with CUDA, never registered
// with ctest (CI has nvcc but no GPU); run by hand on a GPU machine. Without a device it says so and
// exits 77 (the conventional "skipped"), so nobody mistakes it for a pass.
#define CATCH_CONFIG_RUNNER
#include <torch/cuda.h>
#include <catch2/catch.hpp>

#include <cstdio>

int main(int argc, char* argv[]) {
  if (torch::cuda::device_count() == 0) {
    std::fprintf(stderr, "titan_cuda_tests: no CUDA device visible; these tests need a GPU. Nothing was run.\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
