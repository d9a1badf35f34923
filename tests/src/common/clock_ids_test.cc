#include <gtest/gtest.h>

#include <thread>
#include <type_traits>
#include <unordered_set>

#include "absl/container/flat_hash_set.h"
#include "src/common/clock.h"
#include "src/common/ids.h"
#include "tests/testing/wait.h"

namespace tandem {
namespace {

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  FakeClock clock;
  MonoTime t0 = clock.now();
  WallTime w0 = clock.wallNow();
  EXPECT_EQ(clock.now(), t0);
  clock.advance(std::chrono::milliseconds(1500));
  EXPECT_EQ(clock.now() - t0, std::chrono::milliseconds(1500));
  EXPECT_EQ(clock.wallNow() - w0, std::chrono::milliseconds(1500));
}

TEST(SystemClockTest, IsMonotonic) {
  Clock& clock = SystemClock::instance();
  MonoTime a = clock.now();
  MonoTime b = clock.now();
  EXPECT_LE(a, b);
}

TEST(FakeClockTest, WaitUntilEndsWhenTimeIsAdvancedPastTheDeadline) {
  FakeClock clock;
  absl::Mutex mu;
  absl::CondVar cv;
  const MonoTime deadline = clock.now() + std::chrono::seconds(30);
  std::atomic<bool> reached{false};
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    while (!clock.waitUntil(cv, mu, deadline)) {
    }
    reached = true;
  });
  ASSERT_TRUE(testutil::waitFor([&] { return clock.numWaiters() == 1; }));
  clock.advance(std::chrono::seconds(29));
  // Not yet: the waiter wakes, sees 29 s and parks again on the deadline.
  ASSERT_TRUE(testutil::waitFor([&] { return clock.numWaiters() == 1; }));
  EXPECT_FALSE(reached.load());
  clock.advance(std::chrono::seconds(1));
  waiter.join();
  EXPECT_TRUE(reached.load());
  EXPECT_EQ(clock.numWaiters(), 0);
}

TEST(FakeClockTest, WaitUntilReturnsAtOnceForAPassedDeadline) {
  FakeClock clock;
  absl::Mutex mu;
  absl::CondVar cv;
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(clock.waitUntil(cv, mu, clock.now()));
  EXPECT_EQ(clock.numWaiters(), 0);
}

TEST(SystemClockTest, WaitUntilHonoursAShortDeadline) {
  Clock& clock = SystemClock::instance();
  absl::Mutex mu;
  absl::CondVar cv;
  absl::MutexLock lock(&mu);
  const MonoTime deadline = clock.now() + std::chrono::milliseconds(2);
  while (!clock.waitUntil(cv, mu, deadline)) {
  }
  EXPECT_GE(clock.now(), deadline);
}

TEST(StrongIdTest, DistinctTypesDoNotMix) {
  static_assert(!std::is_convertible_v<RequestId, BlockHash>);
  static_assert(!std::is_convertible_v<uint64_t, RequestId>);  // explicit construction only
  static_assert(!std::is_same_v<RequestId, BlockHash>);
  RequestId a(7), b(7), c(8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_LT(a, c);
}

TEST(StrongIdTest, HashableInStdAndAbslContainers) {
  std::unordered_set<SessionId> s{SessionId("x"), SessionId("y"), SessionId("x")};
  EXPECT_EQ(s.size(), 2u);
  absl::flat_hash_set<BlockHash> h{BlockHash(1), BlockHash(2), BlockHash(1)};
  EXPECT_EQ(h.size(), 2u);
  EXPECT_TRUE(h.contains(BlockHash(2)));
}

}  // namespace
}  // namespace tandem
