#pragma once
// Validation of metric names, label names and histogram buckets.
//
// Registration (Builder::registerOn, Family::add) calls these and aborts on
// failure, since a bad name is a programming error that should fail the first
// test run rather than produce an exposition Prometheus rejects. They are
// public so tests and callers that build names dynamically can check first.
// All functions are pure and thread-safe.

#include <string_view>

#include "absl/status/status.h"
#include "src/metrics/histogram.h"

namespace tandem::metrics {

// [a-zA-Z_:][a-zA-Z0-9_:]*
absl::Status validateMetricName(std::string_view name);

// [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (reserved for Prometheus).
// `le` is additionally reserved on histograms; see validateLabelNameFor().
absl::Status validateLabelName(std::string_view name);

// validateLabelName(), plus rejects `le` when `type` is a histogram.
absl::Status validateLabelNameFor(MetricType type, std::string_view name);

// Every bound finite (no NaN, no explicit +Inf: it is added implicitly) and
// strictly increasing. An empty list is valid (only the +Inf bucket).
absl::Status validateBuckets(const BucketBoundaries& bounds);

namespace internal {
// Writes "tandem::metrics: <message>" to stderr and aborts.
[[noreturn]] void fatal(std::string_view message);
// fatal() with the status message when `status` is not OK.
void checkOk(const absl::Status& status);
}  // namespace internal

}  // namespace tandem::metrics
