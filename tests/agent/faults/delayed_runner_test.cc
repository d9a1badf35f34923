// The fault transport's timer on a FakeClock: tasks run when the clock
// reaches them, in due order, and stop() runs what is left at once.

#include "tests/agent/faults/delayed_runner.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/testing/wait.h"

namespace tandem::agent::testing {
namespace {

TEST(DelayedRunnerTest, RunsTasksWhenTheClockReachesThemInOrder) {
  FakeClock clock;
  DelayedRunner runner(clock);
  absl::Mutex mu;
  std::vector<int> ran;
  auto record = [&](int v) {
    return [&, v] {
      absl::MutexLock lock(&mu);
      ran.push_back(v);
    };
  };
  runner.at(clock.now() + std::chrono::milliseconds(20), record(2));
  runner.at(clock.now() + std::chrono::milliseconds(10), record(1));
  ASSERT_TRUE(testutil::waitFor([&] { return clock.numWaiters() == 1; }));
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(ran.empty());
  }
  clock.advance(std::chrono::milliseconds(10));
  ASSERT_TRUE(testutil::waitFor([&] {
    absl::MutexLock lock(&mu);
    return ran.size() == 1;
  }));
  // Parked on the second task's time again: it has not run.
  ASSERT_TRUE(testutil::waitFor([&] { return clock.numWaiters() == 1; }));
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(ran, std::vector<int>{1});
  }
  clock.advance(std::chrono::milliseconds(10));
  ASSERT_TRUE(testutil::waitFor([&] {
    absl::MutexLock lock(&mu);
    return ran.size() == 2;
  }));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
}

TEST(DelayedRunnerTest, StopRunsWhatIsPendingAtOnce) {
  FakeClock clock;
  int ran = 0;
  {
    DelayedRunner runner(clock);
    runner.at(clock.now() + std::chrono::hours(1), [&] { ++ran; });
    runner.at(clock.now() + std::chrono::hours(2), [&] { ++ran; });
    runner.stop();
    EXPECT_EQ(ran, 2);
    runner.at(clock.now(), [&] { ++ran; });  // ignored after stop
  }
  EXPECT_EQ(ran, 2);
}

}  // namespace
}  // namespace tandem::agent::testing
