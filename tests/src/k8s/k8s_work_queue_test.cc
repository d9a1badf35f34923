#include <thread>

#include <gtest/gtest.h>

#include "src/k8s/work_queue.h"

namespace tandem::k8s {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(WorkQueueTest, DeduplicatesWaitingKeys) {
  FakeClock clock;
  WorkQueue q({.clock = &clock});
  q.add("a");
  q.add("b");
  q.add("a");
  EXPECT_EQ(q.len(), 2u);
  EXPECT_EQ(q.tryGet(), "a");
  EXPECT_EQ(q.tryGet(), "b");
  EXPECT_EQ(q.tryGet(), std::nullopt);
}

TEST(WorkQueueTest, KeyBeingProcessedIsRequeuedAfterDoneNotBefore) {
  FakeClock clock;
  WorkQueue q({.clock = &clock});
  q.add("a");
  auto key = q.tryGet();
  ASSERT_EQ(key, "a");
  q.add("a");  // changed while being processed
  q.add("a");
  EXPECT_EQ(q.tryGet(), std::nullopt);  // not handed to a second worker
  q.done("a");
  EXPECT_EQ(q.tryGet(), "a");  // processed again, once
  q.done("a");
  EXPECT_EQ(q.tryGet(), std::nullopt);
}

TEST(WorkQueueTest, AddAfterWaitsForTheClockAndEarliestWins) {
  FakeClock clock;
  WorkQueue q({.clock = &clock});
  q.addAfter("a", seconds(10));
  q.addAfter("a", seconds(3));
  q.addAfter("a", seconds(20));
  EXPECT_EQ(q.numDelayed(), 1u);
  EXPECT_EQ(q.tryGet(), std::nullopt);
  clock.advance(seconds(2));
  EXPECT_EQ(q.tryGet(), std::nullopt);
  clock.advance(seconds(1));
  EXPECT_EQ(q.tryGet(), "a");
  q.done("a");
  clock.advance(seconds(30));
  EXPECT_EQ(q.tryGet(), std::nullopt);  // the later times were merged away
  q.addAfter("b", Duration::zero());
  EXPECT_EQ(q.tryGet(), "b");
}

TEST(WorkQueueTest, PerKeyExponentialBackoffAndForget) {
  FakeClock clock;
  WorkQueue q(
      {.baseDelay = milliseconds(5), .maxDelay = milliseconds(40), .qps = 1e9, .burst = 1000000, .clock = &clock});
  std::vector<Duration> waits;
  for (int i = 0; i < 6; ++i) {
    q.addRateLimited("a");
    Duration waited = Duration::zero();
    while (!q.tryGet()) {
      clock.advance(milliseconds(1));
      waited += milliseconds(1);
    }
    q.done("a");
    waits.push_back(waited);
  }
  std::vector<Duration> expected = {milliseconds(5),  milliseconds(10), milliseconds(20),
                                    milliseconds(40), milliseconds(40), milliseconds(40)};
  EXPECT_EQ(waits, expected);
  EXPECT_EQ(q.numRequeues("a"), 6);
  EXPECT_EQ(q.numRequeues("other"), 0);
  q.forget("a");
  EXPECT_EQ(q.numRequeues("a"), 0);
  q.addRateLimited("a");
  clock.advance(milliseconds(5));
  EXPECT_EQ(q.tryGet(), "a");
}

TEST(WorkQueueTest, OverallTokenBucketSpreadsABurst) {
  FakeClock clock;
  // Backoff negligible: the bucket (2 tokens, 10/s) decides.
  WorkQueue q({.baseDelay = Duration(1), .maxDelay = Duration(1), .qps = 10, .burst = 2, .clock = &clock});
  for (int i = 0; i < 5; ++i) q.addRateLimited("k" + std::to_string(i));
  clock.advance(Duration(1));
  EXPECT_EQ(q.len(), 2u);  // the burst
  clock.advance(milliseconds(100));
  EXPECT_EQ(q.len(), 3u);
  clock.advance(milliseconds(100));
  EXPECT_EQ(q.len(), 4u);
  clock.advance(milliseconds(100));
  EXPECT_EQ(q.len(), 5u);
}

TEST(TokenBucketTest, RefillsUpToBurst) {
  FakeClock clock;
  TokenBucket bucket(1.0, 1, clock.now());
  EXPECT_EQ(bucket.reserve(clock.now()), Duration::zero());
  EXPECT_EQ(bucket.reserve(clock.now()), seconds(1));
  EXPECT_EQ(bucket.reserve(clock.now()), seconds(2));
  clock.advance(seconds(100));  // refills to the burst, not beyond
  EXPECT_EQ(bucket.reserve(clock.now()), Duration::zero());
  EXPECT_EQ(bucket.reserve(clock.now()), seconds(1));
}

TEST(WorkQueueTest, ShutDownWakesBlockedGetAndDrops) {
  WorkQueue q;
  std::optional<std::string> got = "unset";
  std::thread worker([&] { got = q.get(); });
  q.shutDown();
  worker.join();
  EXPECT_EQ(got, std::nullopt);
  q.add("late");
  EXPECT_EQ(q.len(), 0u);
  EXPECT_TRUE(q.shuttingDown());
}

TEST(WorkQueueTest, BlockingGetHandsOutReadyKeysFirst) {
  WorkQueue q;
  q.add("a");
  q.shutDown();  // ready keys still come out, then nullopt
  EXPECT_EQ(q.get(), "a");
  EXPECT_EQ(q.get(), std::nullopt);
}

TEST(WorkQueueTest, ConcurrentWorkersNeverShareAKey) {
  WorkQueue q;
  std::atomic<int> inFlight{0};
  std::atomic<bool> overlap{false};
  std::atomic<int> processed{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      while (auto key = q.get()) {
        if (inFlight.fetch_add(1) != 0) overlap = true;
        std::this_thread::yield();
        inFlight.fetch_sub(1);
        ++processed;
        q.done(*key);
      }
    });
  }
  for (int i = 0; i < 2000; ++i) q.add("same");
  while (q.len() > 0) std::this_thread::yield();
  q.shutDown();
  for (auto& t : workers) t.join();
  EXPECT_FALSE(overlap);
  EXPECT_GE(processed.load(), 1);
}

}  // namespace
}  // namespace tandem::k8s
