#pragma once
// Fluent builders that register metric families, shaped like
// prometheus-cpp's BuildCounter()/BuildGauge()/BuildHistogram():
//
//   Family<Histogram>& latency = buildHistogram()
//       .name("tandem_request_duration_seconds")
//       .help("End-to-end request latency.")
//       .labels({{"pool", "p1"}, {"role", "decode"}})
//       .buckets(exponentialBuckets(0.001, 2, 16))  // default: defaultLatencyBuckets()
//       .registerOn(registry);
//   latency.add({}).observe(0.42);
//
// registerOn() validates everything and aborts on a programming error (see
// registry.h for the rules). A builder is a plain value: not thread-safe, but
// there is no reason to share one.

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "src/metrics/family.h"
#include "src/metrics/labels.h"

namespace tandem::metrics {

class Registry;

template <typename T>
class Builder {
 public:
  Builder& name(std::string name) {
    options_.name = std::move(name);
    return *this;
  }
  Builder& help(std::string help) {
    options_.help = std::move(help);
    return *this;
  }
  // Constant labels, merged into every child of the family.
  Builder& labels(Labels constLabels) {
    options_.constLabels = std::move(constLabels);
    return *this;
  }
  // Finite, strictly increasing upper bounds; +Inf is added implicitly.
  Builder& buckets(std::vector<double> bounds) requires std::is_same_v<T, Histogram> {
    options_.buckets = std::move(bounds);
    return *this;
  }

  Family<T>& registerOn(Registry& registry) const;

 private:
  FamilyOptions options_;
};

inline Builder<Counter> buildCounter() { return {}; }
inline Builder<Gauge> buildGauge() { return {}; }
inline Builder<Histogram> buildHistogram() { return {}; }

extern template class Builder<Counter>;
extern template class Builder<Gauge>;
extern template class Builder<Histogram>;

}  // namespace tandem::metrics
