#include "src/metrics/gauge.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::metrics {
namespace {

TEST(GaugeTest, SetIncrementDecrement) {
  Gauge g;
  EXPECT_EQ(g.value(), 0);
  g.set(10);
  g.increment();
  g.increment(4.5);
  g.decrement();
  g.decrement(20);
  EXPECT_EQ(g.value(), -5.5);
  g.set(3);
  EXPECT_EQ(g.value(), 3);
}

TEST(GaugeTest, ConcurrentUpdatesGiveExactTotal) {
  constexpr int kNumThreads = 8;
  constexpr int kNumUpdates = 100000;
  Gauge g;
  std::vector<std::thread> threads;
  for (int t = 0; t < kNumThreads; ++t) {
    threads.emplace_back([&g, t] {
      for (int i = 0; i < kNumUpdates; ++i) {
        if (t % 4 == 0) {
          g.decrement();
        } else {
          g.increment(2);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // 2 threads decrement by 1, 6 increment by 2.
  EXPECT_EQ(g.value(), (6 * 2 - 2) * static_cast<double>(kNumUpdates));
}

}  // namespace
}  // namespace tandem::metrics
