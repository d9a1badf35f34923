#pragma once
// Waiting in tests for something another thread or process does, when there
// is no event to block on. Never a fixed sleep as an assertion: the poll step
// is short and the deadline generous, reached only when a test fails.
// Timing behaviour itself (leases, deadlines, windows) belongs on a FakeClock.

#include <chrono>
#include <functional>
#include <thread>

#include "src/common/clock.h"

namespace tandem::testutil {

// Polls `condition` every `step` until it holds or `timeout` passes; returns
// whether it held (checked once more at the deadline).
inline bool waitFor(const std::function<bool()>& condition, Duration timeout = std::chrono::seconds(30),
                    Duration step = std::chrono::milliseconds(2)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(step);
  }
  return condition();
}

}  // namespace tandem::testutil
