#pragma once
// Point-in-time snapshots of metric families: what Registry::collect()
// returns and what the text serializer writes. Plain values, no locking;
// they can also be built by hand (tests, or a component that exposes
// values it computes itself).

#include <cstdint>
#include <string>
#include <vector>

#include "src/metrics/labels.h"

namespace tandem::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// "counter", "gauge" or "histogram", as written on the # TYPE line.
const char* metricTypeName(MetricType type);

struct HistogramBucket {
  double upperBound = 0;         // the `le` label; the last bucket is +Inf
  uint64_t cumulativeCount = 0;  // observations <= upperBound
};

// One child (one label set) of a family.
struct ClientMetric {
  Labels labels;  // constant labels merged with the child's labels; never "le"
  // Counter and gauge.
  double value = 0;
  // Histogram: cumulative buckets in increasing order ending with +Inf, whose
  // count equals sampleCount.
  std::vector<HistogramBucket> buckets;
  uint64_t sampleCount = 0;
  double sampleSum = 0;
};

struct MetricFamily {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<ClientMetric> metrics;  // sorted by labels when produced by Registry
};

}  // namespace tandem::metrics
