#pragma once
// A distribution of observed values (latencies, batch sizes) counted into
// fixed buckets.
//
// Bucket upper bounds are finite and strictly increasing; a final +Inf bucket
// is always added implicitly. An observation v lands in the first bucket with
// v <= bound (Prometheus `le` semantics); NaN lands only in +Inf (as in the Go
// client) and makes the sum NaN.
//
// Thread-safe: every method may be called from any thread. observe() is a
// binary search plus two relaxed atomic adds, no lock. Counts are kept per
// bucket (not cumulative) and the total count is derived from them, so a
// snapshot always has count == the +Inf bucket; the sum may miss an
// observation that is in flight while a snapshot is taken, which Prometheus
// tolerates.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "src/metrics/metric_family.h"

namespace tandem::metrics {

// Finite, strictly increasing upper bounds, without the implicit +Inf.
using BucketBoundaries = std::vector<double>;

// Request-latency buckets in seconds, 1 ms to 2 min. Wider than Prometheus's
// default (5 ms to 10 s) because LLM requests routinely run for tens of
// seconds while per-token latencies are a few milliseconds.
BucketBoundaries defaultLatencyBuckets();

// start, start*factor, start*factor^2, ... (`count` bounds).
// Aborts unless start > 0, factor > 1 and count >= 1: bad arguments are a
// programming error.
BucketBoundaries exponentialBuckets(double start, double factor, size_t count);

// start, start+width, start+2*width, ... (`count` bounds).
// Aborts unless width > 0, start is finite and count >= 1.
BucketBoundaries linearBuckets(double start, double width, size_t count);

class Histogram {
 public:
  static constexpr MetricType kType = MetricType::kHistogram;

  // Aborts with a message if `bounds` fails validateBuckets() (validate.h):
  // families validate their buckets when registered, so reaching this with
  // bad bounds is a programming error.
  explicit Histogram(BucketBoundaries bounds);
  ~Histogram();
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void observe(double value);

  const BucketBoundaries& bucketBoundaries() const { return bounds_; }
  // Cumulative counts, one per bound plus the final +Inf bucket.
  std::vector<uint64_t> cumulativeCounts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  uint64_t count() const;

  // Snapshot as a ClientMetric (labels left empty).
  ClientMetric collect() const;

 private:
  const BucketBoundaries bounds_;
  // [bounds_.size() + 1] per-bucket (non-cumulative) counts; the last is +Inf.
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0.0};
};

}  // namespace tandem::metrics
