#pragma once
// The registry owns every metric family of a process (or of a component that
// wants its own exposition) and produces snapshots for the /metrics handler:
//
//   std::string body = serializeText(registry.collect());  // text_serializer.h
//
// Registration rules (enforced by add(), i.e. by Builder::registerOn):
// - Registering the same name and type again returns the existing family,
//   so independent components may each "register" a family they share.
// - The same name and type with different constant labels yields a sibling
//   family under the same name; collect() merges siblings into one family.
//   This lets two engines in one process register `{pool="p1"}` and
//   `{pool="p2"}` without knowing about each other. The first help text wins.
// - The same name with a different type, an invalid metric or label name,
//   `le` on a histogram, invalid buckets, or re-registering a histogram with
//   the same constant labels but different buckets is a programming error:
//   add() prints a message naming the offending name and aborts.
//
// Thread-safe: all methods may be called concurrently. Families live as long
// as the registry; references returned by add() stay valid until then.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "src/metrics/family.h"
#include "src/metrics/metric_family.h"

namespace tandem::metrics {

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Returns the family for `options`, creating it if needed (rules above).
  // T is Counter, Gauge or Histogram. A new histogram family with no buckets
  // gets defaultLatencyBuckets(); registering an existing one with no buckets
  // accepts whatever it has. Most code uses the builders instead.
  template <typename T>
  Family<T>& add(FamilyOptions options);

  // `hook` runs at the start of every collect(), before anything is read,
  // so gauges that mirror state owned elsewhere (free KV blocks, queue
  // depth) can be refreshed at scrape time instead of on every change.
  // Hooks run on the collecting thread, in the order added, one collect() at
  // a time; they may update metrics and register families but must not call
  // collect() (it would deadlock).
  void addCollectHook(std::function<void()> hook);

  // Runs the hooks, then snapshots every family: sorted by name, siblings
  // merged, children sorted by label set. Families without children are
  // left out (nothing to expose).
  std::vector<MetricFamily> collect() const;

 private:
  struct Entry {
    MetricType type;
    std::vector<std::unique_ptr<FamilyBase>> siblings;  // distinct constant labels
  };

  FamilyBase& addBase(MetricType type, FamilyOptions options, std::unique_ptr<FamilyBase> (*make)(FamilyOptions));

  // Serializes collect() calls so hooks never run concurrently with each
  // other. Taken before mu_.
  mutable absl::Mutex collectMu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> hooks_ ABSL_GUARDED_BY(mu_);
};

extern template Family<Counter>& Registry::add<Counter>(FamilyOptions);
extern template Family<Gauge>& Registry::add<Gauge>(FamilyOptions);
extern template Family<Histogram>& Registry::add<Histogram>(FamilyOptions);

}  // namespace tandem::metrics
