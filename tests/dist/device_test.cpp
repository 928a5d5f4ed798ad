// SPDX-License-Identifier: BSD-3-Clause
// One GPU per rank by LOCAL_RANK: the rule, its error, and the CPU where no GPU is visible.
#include <ATen/Context.h>

#include "test_util.hpp"
#include "titan/dist/device.hpp"

TEST_CASE("a rank's device: GPU LOCAL_RANK, the CPU without GPUs, more ranks than GPUs refused", "[dist][device]") {
  CHECK(titan::dist::rank_device_index(0, 8) == 0);
  CHECK(titan::dist::rank_device_index(7, 8) == 7);
  CHECK(titan::dist::rank_device_index(3, 0) == -1);
  const std::string error = titan::test::error_of([] { (void)titan::dist::rank_device_index(8, 8); });
  CHECK_THAT(error, Catch::Contains("LOCAL_RANK in [0, 8)") && Catch::Contains("got 8") &&
                        Catch::Contains("--nproc-per-node 8"));
  CHECK_THAT(titan::test::error_of([] { (void)titan::dist::rank_device_index(-1, 2); }), Catch::Contains("got -1"));
  if (!at::hasCUDA()) CHECK(titan::dist::select_rank_device(5) == at::Device(at::kCPU));
}
