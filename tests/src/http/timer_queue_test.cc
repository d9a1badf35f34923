// TimerQueue on a FakeClock: callbacks run when the clock is advanced to
// their deadline, in deadline order, and never for a cancelled timer.

#include "src/http/timer_queue.h"

#include <gtest/gtest.h>

#include <vector>

#include "absl/synchronization/mutex.h"
#include "tests/testing/quiet_logs.h"
#include "tests/testing/wait.h"

namespace tandem::http {
namespace {

using std::chrono::seconds;
using testutil::waitFor;

// What ran, and the clock's time when it ran.
struct Log {
  absl::Mutex mu;
  std::vector<std::pair<std::string, MonoTime>> runs ABSL_GUARDED_BY(mu);

  std::function<void()> record(const FakeClock& clock, std::string name) {
    return [this, &clock, name] {
      absl::MutexLock lock(&mu);
      runs.emplace_back(name, clock.now());
    };
  }
  size_t size() {
    absl::MutexLock lock(&mu);
    return runs.size();
  }
  std::vector<std::pair<std::string, MonoTime>> get() {
    absl::MutexLock lock(&mu);
    return runs;
  }
};

TEST(TimerQueueTest, RunsEachCallbackAtItsDeadlineInOrder) {
  FakeClock clock;
  Log log;
  TimerQueue timers(clock);
  const MonoTime t0 = clock.now();
  timers.schedule(t0 + seconds(10), log.record(clock, "late"));
  timers.schedule(t0 + seconds(5), log.record(clock, "early"));
  timers.schedule(t0 + seconds(5), log.record(clock, "early-second"));

  clock.advance(seconds(5));
  ASSERT_TRUE(waitFor([&] { return log.size() == 2; }));
  clock.advance(seconds(5));
  ASSERT_TRUE(waitFor([&] { return log.size() == 3; }));
  auto runs = log.get();
  EXPECT_EQ(runs[0].first, "early");
  EXPECT_EQ(runs[1].first, "early-second");
  EXPECT_EQ(runs[2].first, "late");
  // The clock only moves when the test advances it, so a callback that ran
  // early would have recorded a time before its deadline.
  EXPECT_EQ(runs[2].second, t0 + seconds(10));
}

TEST(TimerQueueTest, CancelledTimerNeverRuns) {
  FakeClock clock;
  Log log;
  TimerQueue timers(clock);
  const MonoTime t0 = clock.now();
  TimerQueue::Id cancelled = timers.schedule(t0 + seconds(1), log.record(clock, "cancelled"));
  timers.schedule(t0 + seconds(2), log.record(clock, "kept"));
  timers.cancel(cancelled);
  clock.advance(seconds(2));
  // "kept" runs after anything due earlier: had "cancelled" survived, it
  // would be in the log before it.
  ASSERT_TRUE(waitFor([&] { return log.size() == 1; }));
  EXPECT_EQ(log.get()[0].first, "kept");
}

TEST(TimerQueueTest, PastDeadlineRunsAtOnceAndStopDropsTheRest) {
  FakeClock clock;
  Log log;
  TimerQueue timers(clock);
  timers.schedule(clock.now() - seconds(1), log.record(clock, "past"));
  ASSERT_TRUE(waitFor([&] { return log.size() == 1; }));
  timers.schedule(clock.now() + seconds(1), log.record(clock, "dropped"));
  timers.stop();
  EXPECT_EQ(timers.schedule(clock.now(), log.record(clock, "after stop")), 0u);
  clock.advance(seconds(5));
  // The thread is joined: nothing can run any more.
  EXPECT_EQ(log.size(), 1u);
}

}  // namespace
}  // namespace tandem::http
