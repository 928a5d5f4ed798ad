// SPDX-License-Identifier: BSD-3-Clause
// Catch2 (v2, as Debian ships it) entry point for titan_tests.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>

// Every ctest starts titan_tests for one test case. Returning from main would run the static destructors, in which
// LibTorch deregisters each of its operators: 0.11 s a process, more than many a test case takes. The reporters
// have written everything when run() returns; flushed, the process ends without them. Under AddressSanitizer main
// returns, so that LeakSanitizer still checks the process at its exit (tools/program_exit.cpp does the same).
int main(int argc, char* argv[]) {
  const int result = Catch::Session().run(argc, argv);
#if defined(__SANITIZE_ADDRESS__)
  return result;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return result;
#endif
#endif
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(result);
}
