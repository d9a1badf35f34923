// The work-proportional prefill deadline (prefill_deadline.h): pure arithmetic.

#include "agent/prefill_deadline.h"

#include <gtest/gtest.h>

namespace tandem::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr PrefillDeadlineOptions kOptions{.floor = milliseconds(2000), .slack = 4.0, .assumed_rate = 1000.0};

TEST(PrefillRateTest, BeforeAnyMeasurementTheAssumedRateAndTheFloorDecide) {
  PrefillRate rate(kOptions);
  EXPECT_FALSE(rate.measured());
  EXPECT_EQ(rate.budget(0), milliseconds(2000));
  EXPECT_EQ(rate.budget(100), milliseconds(2000));  // 4 × 0.1 s is below the floor
  EXPECT_EQ(rate.budget(10000), seconds(40));       // 4 × 10 s
}

TEST(PrefillRateTest, TheMeasuredRateScalesWithThePrompt) {
  PrefillRate rate(kOptions);
  rate.record(20000, seconds(1));  // 20k tokens/s
  ASSERT_TRUE(rate.measured());
  EXPECT_DOUBLE_EQ(*rate.measured(), 20000.0);
  EXPECT_EQ(rate.budget(100000), seconds(20));  // 4 × 5 s: a long prompt gets long
  EXPECT_EQ(rate.budget(5000), milliseconds(2000));
}

TEST(PrefillRateTest, LaterMeasurementsMoveTheAverageGradually) {
  PrefillRate rate(kOptions);
  rate.record(1000, seconds(1));   // 1000/s
  rate.record(1000, seconds(10));  // 100/s: a slow one moves it a quarter of the way
  EXPECT_DOUBLE_EQ(*rate.measured(), 0.75 * 1000 + 0.25 * 100);
}

TEST(PrefillRateTest, NothingComputedSaysNothingAboutTheRate) {
  PrefillRate rate(kOptions);
  rate.record(0, seconds(1));  // a whole-prompt cache hit
  rate.record(500, milliseconds(0));
  rate.record(-3, seconds(1));
  EXPECT_FALSE(rate.measured());
  EXPECT_EQ(rate.budget(-5), milliseconds(2000));
}

TEST(PrefillRateTest, AnAbsurdPromptDoesNotOverflowTheBudget) {
  PrefillRate rate({.floor = milliseconds(10), .slack = 1000.0, .assumed_rate = 1.0});
  EXPECT_GT(rate.budget(int64_t{1} << 40), seconds(1000));
}

}  // namespace
}  // namespace tandem::agent
