#pragma once
// A metric family: one name, help text and type, with one child metric per
// label set.
//
//   Family<Counter>& requests = buildCounter()
//       .name("tandem_requests_total").help("Finished requests.")
//       .labels({{"pool", "p1"}})           // constant labels, on every child
//       .registerOn(registry);
//   Counter& eos = requests.add({{"finish_reason", "eos"}});
//   eos.increment();                        // hot path: no lookup, no lock
//
// Histogram families take their bucket bounds from the builder
// (Builder<Histogram>::buckets(), default defaultLatencyBuckets()), so every
// child of a family has the same buckets and can be aggregated with
// `sum by (le)`. add(labels, buckets) exists for prometheus-cpp parity and
// gives a new child its own buckets.
//
// Thread-safe: add(), remove(), has() and collect() may be called from any
// thread (a mutex guards the children; it is not on the metric hot path).
// Children are owned by the family and live until remove() or until the
// Registry that owns the family is destroyed.

#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "src/metrics/labels.h"
#include "src/metrics/metric_family.h"

namespace tandem::metrics {

class Counter;
class Gauge;
class Histogram;

// What a builder hands the registry. `buckets` is used by histograms only.
struct FamilyOptions {
  std::string name;
  std::string help;
  Labels constLabels;
  std::vector<double> buckets;
};

// The type-independent part of a family, which the Registry stores.
class FamilyBase {
 public:
  explicit FamilyBase(FamilyOptions options) : options_(std::move(options)) {}
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  virtual MetricType type() const = 0;
  const std::string& name() const { return options_.name; }
  const std::string& help() const { return options_.help; }
  const Labels& constLabels() const { return options_.constLabels; }
  // Histogram families: the bounds add(labels) uses. Empty for others.
  const std::vector<double>& buckets() const { return options_.buckets; }

  // Appends one ClientMetric per child, in label order, labels including the
  // constant labels.
  virtual void collect(std::vector<ClientMetric>& out) const = 0;

 protected:
  const FamilyOptions options_;
};

template <typename T>
class Family final : public FamilyBase {
 public:
  // Use the builders (builder.h) rather than constructing families directly;
  // an unregistered family is never exposed. Options are assumed validated.
  explicit Family(FamilyOptions options);
  ~Family() override;

  MetricType type() const override;

  // Returns the child for `labels` (merged with the constant labels),
  // creating it on first use; the same label set always yields the same
  // child. Aborts on an invalid label name, on `le` for histograms, or when
  // `labels` repeats a constant label's name.
  T& add(const Labels& labels);

  // Histograms only: as add(labels), but a newly created child uses
  // `buckets`. Aborts if the buckets are invalid, or if the child already
  // exists with different buckets.
  T& add(const Labels& labels, const std::vector<double>& buckets) requires std::is_same_v<T, Histogram>;

  // Destroys `child` (a reference from add()); any reference still held to
  // it dangles. Does nothing if `child` is not in this family.
  void remove(T* child);

  // Destroys every child whose labels include all of `subset` (every child
  // for an empty subset), e.g. a deleted pool's {namespace, pool}. Returns
  // how many went; references held to them dangle.
  size_t removeMatching(const Labels& subset);

  // True if a child with `labels` (without the constant labels) exists.
  bool has(const Labels& labels) const;

  void collect(std::vector<ClientMetric>& out) const override;

 private:
  // Constant labels merged with `labels`; aborts on a clash or a bad name.
  Labels mergeLabels(const Labels& labels) const;
  T& addMerged(Labels merged, const std::vector<double>* buckets);

  mutable absl::Mutex mu_;
  // Keyed by the full (merged) label set, so collect() is already sorted.
  std::map<Labels, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

}  // namespace tandem::metrics
