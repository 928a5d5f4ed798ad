// SPDX-License-Identifier: BSD-3-Clause
// What the in-process multi-rank tests (ranks as threads, dist::run_local_ranks) build their meshes with: the
// strict backend, Gloo with NCCL's rules enforced (docs/distributed.md), so that what would hang or mismatch under
// NCCL fails the test naming the ranks and calls. A test about plain Gloo itself opts out with `.backend = "gloo"`
// and a `// plain Gloo: <why>` comment; scripts/check_strict_tests.py holds every test to this, and
// docs/testing.md lists the exceptions. (Tests that start processes get the same default from Subprocess.)
#pragma once

#include <algorithm>
#include <chrono>

#include "test_util.hpp"
#include "titan/dist/mesh.hpp"

namespace titan::test {

/// A multi-rank test's mesh: the strict backend; each collective waits patience(timeout) for the other ranks (a
/// deadlock test shortens it), the rendezvous as long or at least a minute's patience.
inline dist::MeshOptions mesh_options(std::chrono::seconds timeout = std::chrono::seconds(60)) {
  return {.backend = "strict",
          .init_timeout = patience(std::max<std::chrono::milliseconds>(timeout, std::chrono::seconds(60))),
          .timeout = patience(timeout)};
}

}  // namespace titan::test
