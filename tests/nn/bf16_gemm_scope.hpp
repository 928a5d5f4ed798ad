// SPDX-License-Identifier: BSD-3-Clause
// A scope that sets the process's bf16 GEMM choice and restores the previous one, for tests that compare
// the native and the widened bf16 paths.
#pragma once

#include "titan/nn/bf16_gemm.hpp"

namespace titan::test {

/// Sets the process's bf16 GEMM choice for a scope and restores the previous one.
class Bf16GemmScope {
 public:
  explicit Bf16GemmScope(nn::Bf16Gemm choice) : was_(nn::bf16_gemm()) { nn::set_bf16_gemm(choice); }
  ~Bf16GemmScope() { nn::set_bf16_gemm(was_); }
  Bf16GemmScope(const Bf16GemmScope&) = delete;
  Bf16GemmScope& operator=(const Bf16GemmScope&) = delete;

 private:
  nn::Bf16Gemm was_;
};

}  // namespace titan::test
