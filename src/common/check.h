#pragma once
// TANDEM_CHECK(cond, message): an invariant that stays checked in Release
// builds (unlike assert, which ./tandem test's Release build compiles out).
// On failure it prints "invariant violated: <cond> (<file>:<line>): <message>"
// to stderr and aborts: the process state is already wrong, and going on
// could corrupt KV or leak blocks silently. Use it for the cheap O(1)
// invariants of the block manager and the scheduler, not for bad input
// (which gets a Status).
//
//   TANDEM_CHECK(b.ref > 0, "release of a block nobody holds");

#include <cstdio>
#include <cstdlib>

namespace tandem::check_internal {

[[noreturn]] inline void fail(const char* cond, const char* file, int line, const char* message) {
  std::fprintf(stderr, "invariant violated: %s (%s:%d): %s\n", cond, file, line, message);
  std::fflush(stderr);
  std::abort();
}

}  // namespace tandem::check_internal

#define TANDEM_CHECK(cond, message)                                                   \
  do {                                                                                \
    if (__builtin_expect(!(cond), 0)) {                                               \
      ::tandem::check_internal::fail(#cond, __FILE__, __LINE__, message);             \
    }                                                                                 \
  } while (0)
