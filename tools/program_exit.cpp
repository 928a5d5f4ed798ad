// SPDX-License-Identifier: BSD-3-Clause
// Linked into every program (titan_add_program): a process that exits 0 ends without the static destructors of the
// libraries it loaded. LibTorch's deregister each of its operators one by one, 0.1-0.2 s of CPU at every exit; a
// multi-process test starts dozens of ranks, and a job's ranks all exit at once on the same cores. What a program made
// after its start (its objects in main, function-local statics) is destroyed as before: exit() runs the handlers
// registered after this one first. Under AddressSanitizer the process ends as usual, so that LeakSanitizer still checks
// it.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TITAN_PROGRAM_EXIT_FULL 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TITAN_PROGRAM_EXIT_FULL 1
#endif

namespace {

#ifndef TITAN_PROGRAM_EXIT_FULL
void titan_program_exit_now(int status, void*) {
  // A failed exit keeps its teardown: a rank that fails under titan-run gets the others stopped once it is gone, and
  // a rank that failed with it prints why in that time (tests/dist/flight_recorder_test.cpp holds both to it).
  if (status != 0) return;
  std::cout.flush();
  std::clog.flush();
  std::fflush(nullptr);
  _exit(status);
}

// The executable's constructors run after those of the libraries it links, whose destructors are registered as
// their statics are built: this handler comes after them, so exit() calls it before them.
__attribute__((constructor)) void titan_program_exit_register() { on_exit(titan_program_exit_now, nullptr); }
#endif

}  // namespace
