#include "src/metrics/histogram.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "src/common/strings.h"
#include "src/metrics/validate.h"

namespace tandem::metrics {

BucketBoundaries defaultLatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

BucketBoundaries exponentialBuckets(double start, double factor, size_t count) {
  if (!(start > 0) || !std::isfinite(start) || !(factor > 1) || count < 1) {
    internal::fatal(
        strCat("exponentialBuckets(", start, ", ", factor, ", ", count, "): need start > 0, factor > 1, count >= 1"));
  }
  BucketBoundaries bounds;
  bounds.reserve(count);
  double bound = start;
  for (size_t i = 0; i < count; ++i) {
    bounds.push_back(bound);
    bound *= factor;
  }
  return bounds;
}

BucketBoundaries linearBuckets(double start, double width, size_t count) {
  if (!std::isfinite(start) || !(width > 0) || !std::isfinite(width) || count < 1) {
    internal::fatal(
        strCat("linearBuckets(", start, ", ", width, ", ", count, "): need finite start, width > 0, count >= 1"));
  }
  BucketBoundaries bounds;
  bounds.reserve(count);
  // start + i * width rather than repeated addition, so error does not accumulate.
  for (size_t i = 0; i < count; ++i) bounds.push_back(start + static_cast<double>(i) * width);
  return bounds;
}

Histogram::Histogram(BucketBoundaries bounds)
    : bounds_(std::move(bounds)), counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  // make_unique value-initializes, and since C++20 that zeroes std::atomic.
  internal::checkOk(validateBuckets(bounds_));
}

Histogram::~Histogram() = default;

void Histogram::observe(double value) {
  // First bound >= value; NaN compares false everywhere, so it is sent to +Inf.
  size_t bucket = std::isnan(value)
                      ? bounds_.size()
                      : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::cumulativeCounts() const {
  std::vector<uint64_t> cumulative(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    cumulative[i] = running;
  }
  return cumulative;
}

uint64_t Histogram::count() const {
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) total += counts_[i].load(std::memory_order_relaxed);
  return total;
}

ClientMetric Histogram::collect() const {
  ClientMetric metric;
  std::vector<uint64_t> cumulative = cumulativeCounts();
  metric.buckets.reserve(cumulative.size());
  for (size_t i = 0; i < bounds_.size(); ++i) metric.buckets.push_back({bounds_[i], cumulative[i]});
  metric.buckets.push_back({HUGE_VAL, cumulative.back()});
  metric.sampleCount = cumulative.back();
  metric.sampleSum = sum();
  return metric;
}

}  // namespace tandem::metrics
