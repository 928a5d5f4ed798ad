// SPDX-License-Identifier: BSD-3-Clause
// debug.deterministic: ATen's deterministic algorithms and the cuBLAS workspace setting it needs on CUDA,
// set on CPU too (a CUDA run reads the variable at its first cuBLAS handle, after the trainer's start).
#include <ATen/ATen.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/train/step.hpp"

namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::nullopt : std::optional<std::string>(value);
}

// Puts the global state back as it was, however the case ends.
struct RestoreDeterminism {
  std::optional<std::string> workspace = env("CUBLAS_WORKSPACE_CONFIG");
  bool algorithms = at::globalContext().deterministicAlgorithms();
  bool warn_only = at::globalContext().deterministicAlgorithmsWarnOnly();
  ~RestoreDeterminism() {
    at::globalContext().setDeterministicAlgorithms(algorithms, warn_only);
    if (workspace) {
      setenv("CUBLAS_WORKSPACE_CONFIG", workspace->c_str(), 1);
    } else {
      unsetenv("CUBLAS_WORKSPACE_CONFIG");
    }
  }
};

}  // namespace

TEST_CASE("debug.deterministic sets deterministic algorithms and CUBLAS_WORKSPACE_CONFIG, keeping a user's value",
          "[train][deterministic]") {
  const RestoreDeterminism restore;
  unsetenv("CUBLAS_WORKSPACE_CONFIG");
  at::globalContext().setDeterministicAlgorithms(false, false);

  titan::use_deterministic_algorithms({.deterministic = false});
  CHECK_FALSE(at::globalContext().deterministicAlgorithms());
  CHECK_FALSE(env("CUBLAS_WORKSPACE_CONFIG").has_value());

  titan::use_deterministic_algorithms({.deterministic = true, .deterministic_warn_only = true});
  CHECK(at::globalContext().deterministicAlgorithms());
  CHECK(at::globalContext().deterministicAlgorithmsWarnOnly());
  CHECK(env("CUBLAS_WORKSPACE_CONFIG") == std::optional<std::string>(":4096:8"));

  setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
  titan::use_deterministic_algorithms({.deterministic = true});
  CHECK_FALSE(at::globalContext().deterministicAlgorithmsWarnOnly());
  CHECK(env("CUBLAS_WORKSPACE_CONFIG") == std::optional<std::string>(":16:8"));
}
