#pragma once
// A value that goes up and down (queue depth, free KV blocks).
//
// Thread-safe: every method may be called from any thread; each is one
// relaxed atomic operation. Gauges that mirror state owned elsewhere are best
// refreshed at scrape time from a Registry collect hook. Created and owned by
// Family<Gauge>::add().

#include <atomic>

#include "src/metrics/metric_family.h"

namespace tandem::metrics {

class Gauge {
 public:
  static constexpr MetricType kType = MetricType::kGauge;

  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void increment(double v = 1.0) { value_.fetch_add(v, std::memory_order_relaxed); }
  void decrement(double v = 1.0) { value_.fetch_sub(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

}  // namespace tandem::metrics
