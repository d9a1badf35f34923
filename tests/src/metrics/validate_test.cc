#include "src/metrics/validate.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "src/common/strings.h"

namespace tandem::metrics {
namespace {

TEST(ValidateTest, MetricNames) {
  for (const char* good : {"tandem_requests_total", "a", "_x", ":colon:ok", "abc123", "A_b:C"}) {
    EXPECT_TRUE(validateMetricName(good).ok()) << good;
  }
  for (const char* bad : {"", "1abc", "has-dash", "has space", "dot.name", "é"}) {
    EXPECT_FALSE(validateMetricName(bad).ok()) << bad;
  }
}

TEST(ValidateTest, MetricNameErrorNamesTheName) {
  absl::Status s = validateMetricName("bad-name");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(toStd(s.message()).find("\"bad-name\""), std::string_view::npos) << s;
}

TEST(ValidateTest, LabelNames) {
  for (const char* good : {"pool", "_private", "finish_reason", "a1", "le", "_"}) {
    EXPECT_TRUE(validateLabelName(good).ok()) << good;
  }
  for (const char* bad : {"", "1a", "has:colon", "has-dash", "__reserved", "__"}) {
    EXPECT_FALSE(validateLabelName(bad).ok()) << bad;
  }
}

TEST(ValidateTest, LeIsReservedOnlyOnHistograms) {
  EXPECT_TRUE(validateLabelNameFor(MetricType::kCounter, "le").ok());
  EXPECT_TRUE(validateLabelNameFor(MetricType::kGauge, "le").ok());
  EXPECT_FALSE(validateLabelNameFor(MetricType::kHistogram, "le").ok());
  EXPECT_TRUE(validateLabelNameFor(MetricType::kHistogram, "pool").ok());
  EXPECT_FALSE(validateLabelNameFor(MetricType::kHistogram, "__x").ok());
}

TEST(ValidateTest, Buckets) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(validateBuckets({}).ok());
  EXPECT_TRUE(validateBuckets({-1, 0, 0.5, 10}).ok());
  EXPECT_FALSE(validateBuckets({1, 1}).ok());
  EXPECT_FALSE(validateBuckets({2, 1}).ok());
  EXPECT_FALSE(validateBuckets({1, kInf}).ok());
  EXPECT_FALSE(validateBuckets({-kInf, 1}).ok());
  EXPECT_FALSE(validateBuckets({1, std::nan(""), 3}).ok());
}

}  // namespace
}  // namespace tandem::metrics
