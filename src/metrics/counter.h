#pragma once
// A monotonically increasing value (requests served, tokens generated).
//
// Thread-safe: every method may be called from any thread. increment() is one
// relaxed atomic read-modify-write, cheap enough for the engine hot path.
// Counters are created by Family<Counter>::add(), which owns them; keep the
// returned reference rather than looking the child up per event.

#include <atomic>

#include "src/metrics/metric_family.h"

namespace tandem::metrics {

class Counter {
 public:
  static constexpr MetricType kType = MetricType::kCounter;

  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  void increment() { value_.fetch_add(1.0, std::memory_order_relaxed); }

  // Adds `v`. A counter never goes down, so a negative or NaN `v` is ignored
  // and the value is kept (prometheus-cpp does the same rather than throw).
  void increment(double v) {
    if (!(v >= 0.0)) return;
    value_.fetch_add(v, std::memory_order_relaxed);
  }

  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

}  // namespace tandem::metrics
