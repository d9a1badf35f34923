#include "src/metrics/histogram.h"

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::metrics {
namespace {

using ::testing::ElementsAre;

TEST(HistogramTest, CountsAreCumulativeWithUpperBoundInclusive) {
  Histogram h({1, 2, 5});
  for (double v : {0.5, 1.0, 1.5, 2.0, 4.0, 7.0, -3.0}) h.observe(v);
  // <=1: 0.5, 1, -3; <=2: +1.5, 2; <=5: +4; +Inf: +7.
  EXPECT_THAT(h.cumulativeCounts(), ElementsAre(3, 5, 6, 7));
  EXPECT_EQ(h.count(), 7u);
  EXPECT_DOUBLE_EQ(h.sum(), 0.5 + 1 + 1.5 + 2 + 4 + 7 - 3);
}

TEST(HistogramTest, CollectEndsWithInfBucketEqualToCount) {
  Histogram h({0.1, 1});
  h.observe(0.05);
  h.observe(100);
  ClientMetric m = h.collect();
  ASSERT_EQ(m.buckets.size(), 3u);
  EXPECT_EQ(m.buckets[0].upperBound, 0.1);
  EXPECT_EQ(m.buckets[0].cumulativeCount, 1u);
  EXPECT_EQ(m.buckets[1].upperBound, 1);
  EXPECT_EQ(m.buckets[1].cumulativeCount, 1u);
  EXPECT_TRUE(std::isinf(m.buckets[2].upperBound) && m.buckets[2].upperBound > 0);
  EXPECT_EQ(m.buckets[2].cumulativeCount, 2u);
  EXPECT_EQ(m.sampleCount, 2u);
  EXPECT_DOUBLE_EQ(m.sampleSum, 100.05);
}

TEST(HistogramTest, NaNGoesToInfBucketOnly) {
  Histogram h({1});
  h.observe(std::nan(""));
  EXPECT_THAT(h.cumulativeCounts(), ElementsAre(0, 1));
  EXPECT_TRUE(std::isnan(h.sum()));
}

TEST(HistogramTest, NoBoundsMeansOnlyInf) {
  Histogram h({});
  h.observe(3);
  EXPECT_THAT(h.cumulativeCounts(), ElementsAre(1));
}

TEST(HistogramTest, ConcurrentObservationsAreAllCounted) {
  constexpr int kNumThreads = 8;
  constexpr int kNumObservations = 50000;
  Histogram h({1, 2, 3});
  std::vector<std::thread> threads;
  for (int t = 0; t < kNumThreads; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < kNumObservations; ++i) h.observe(t % 4);  // 0, 1, 2, 3
    });
  }
  for (std::thread& t : threads) t.join();
  constexpr uint64_t kPerValue = 2 * kNumObservations;
  EXPECT_THAT(h.cumulativeCounts(), ElementsAre(2 * kPerValue, 3 * kPerValue, 4 * kPerValue, 4 * kPerValue));
  EXPECT_EQ(h.sum(), static_cast<double>(kPerValue) * (0 + 1 + 2 + 3));
}

TEST(HistogramTest, ExponentialBuckets) {
  EXPECT_THAT(exponentialBuckets(1, 2, 4), ElementsAre(1, 2, 4, 8));
  EXPECT_THAT(exponentialBuckets(0.5, 10, 3), ElementsAre(0.5, 5, 50));
}

TEST(HistogramTest, LinearBuckets) {
  EXPECT_THAT(linearBuckets(0, 0.5, 4), ElementsAre(0, 0.5, 1, 1.5));
  EXPECT_THAT(linearBuckets(-1, 1, 3), ElementsAre(-1, 0, 1));
}

TEST(HistogramTest, DefaultLatencyBucketsAreValidAndSpanMillisToMinutes) {
  BucketBoundaries b = defaultLatencyBuckets();
  ASSERT_FALSE(b.empty());
  EXPECT_LE(b.front(), 0.001);
  EXPECT_GE(b.back(), 60);
  for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
}

using HistogramDeathTest = ::testing::Test;

TEST(HistogramDeathTest, BadBucketHelperArgumentsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(exponentialBuckets(0, 2, 3), "exponentialBuckets");
  EXPECT_DEATH(exponentialBuckets(1, 1, 3), "exponentialBuckets");
  EXPECT_DEATH(linearBuckets(0, 0, 3), "linearBuckets");
  EXPECT_DEATH(linearBuckets(0, 1, 0), "linearBuckets");
}

TEST(HistogramDeathTest, BadBoundsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(Histogram({2, 1}), "strictly increasing");
  EXPECT_DEATH(Histogram({1, std::numeric_limits<double>::infinity()}), "finite");
}

}  // namespace
}  // namespace tandem::metrics
