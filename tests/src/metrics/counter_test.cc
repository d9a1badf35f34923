#include "src/metrics/counter.h"

#include <cmath>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::metrics {
namespace {

TEST(CounterTest, StartsAtZeroAndIncrements) {
  Counter c;
  EXPECT_EQ(c.value(), 0);
  c.increment();
  c.increment(2.5);
  EXPECT_EQ(c.value(), 3.5);
}

TEST(CounterTest, IgnoresNegativeAndNaNIncrements) {
  Counter c;
  c.increment(4);
  c.increment(-1);
  c.increment(std::nan(""));
  EXPECT_EQ(c.value(), 4);
  c.increment(0);
  EXPECT_EQ(c.value(), 4);
}

TEST(CounterTest, ConcurrentIncrementsGiveExactTotal) {
  constexpr int kNumThreads = 8;
  constexpr int kNumIncrements = 100000;
  Counter c;
  std::vector<std::thread> threads;
  for (int t = 0; t < kNumThreads; ++t) {
    threads.emplace_back([&c, t] {
      for (int i = 0; i < kNumIncrements; ++i) {
        if (t % 2 == 0) {
          c.increment();
        } else {
          c.increment(2.0);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // Half the threads add 1, half add 2; every sum is an exact double.
  EXPECT_EQ(c.value(), kNumThreads / 2 * kNumIncrements * 3.0);
}

}  // namespace
}  // namespace tandem::metrics
