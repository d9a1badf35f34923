#include "src/metrics/family.h"

#include <utility>

#include "src/common/strings.h"
#include "src/metrics/counter.h"
#include "src/metrics/gauge.h"
#include "src/metrics/histogram.h"
#include "src/metrics/validate.h"

namespace tandem::metrics {
namespace {

ClientMetric collectChild(const Counter& c) {
  ClientMetric metric;
  metric.value = c.value();
  return metric;
}

ClientMetric collectChild(const Gauge& g) {
  ClientMetric metric;
  metric.value = g.value();
  return metric;
}

ClientMetric collectChild(const Histogram& h) { return h.collect(); }

template <typename T>
std::unique_ptr<T> makeChild(const std::vector<double>& buckets) {
  if constexpr (std::is_same_v<T, Histogram>) {
    return std::make_unique<Histogram>(buckets);
  } else {
    return std::make_unique<T>();
  }
}

}  // namespace

template <typename T>
Family<T>::Family(FamilyOptions options) : FamilyBase(std::move(options)) {}

template <typename T>
Family<T>::~Family() = default;

template <typename T>
MetricType Family<T>::type() const {
  return T::kType;
}

template <typename T>
Labels Family<T>::mergeLabels(const Labels& labels) const {
  Labels merged = options_.constLabels;
  for (const auto& [name, value] : labels) {
    if (absl::Status s = validateLabelNameFor(T::kType, name); !s.ok()) {
      internal::fatal(strCat("metric ", options_.name, ": ", toStd(s.message())));
    }
    if (!merged.emplace(name, value).second) {
      internal::fatal(
          strCat("metric ", options_.name, ": label \"", name, "\" is already a constant label of the family"));
    }
  }
  return merged;
}

template <typename T>
T& Family<T>::add(const Labels& labels) {
  return addMerged(mergeLabels(labels), nullptr);
}

template <typename T>
T& Family<T>::add(const Labels& labels, const std::vector<double>& buckets) requires std::is_same_v<T, Histogram> {
  if (absl::Status s = validateBuckets(buckets); !s.ok()) {
    internal::fatal(strCat("metric ", options_.name, ": ", toStd(s.message())));
  }
  return addMerged(mergeLabels(labels), &buckets);
}

template <typename T>
T& Family<T>::addMerged(Labels merged, const std::vector<double>* buckets) {
  absl::MutexLock lock(&mu_);
  auto it = children_.find(merged);
  if (it != children_.end()) {
    if constexpr (std::is_same_v<T, Histogram>) {
      if (buckets != nullptr && it->second->bucketBoundaries() != *buckets) {
        internal::fatal(
            strCat("metric ", options_.name, ": child added again with different buckets than it was created with"));
      }
    }
    return *it->second;
  }
  const std::vector<double>& bounds = buckets != nullptr ? *buckets : options_.buckets;
  auto [inserted, ok] = children_.emplace(std::move(merged), makeChild<T>(bounds));
  return *inserted->second;
}

template <typename T>
void Family<T>::remove(T* child) {
  absl::MutexLock lock(&mu_);
  for (auto it = children_.begin(); it != children_.end(); ++it) {
    if (it->second.get() == child) {
      children_.erase(it);
      return;
    }
  }
}

template <typename T>
size_t Family<T>::removeMatching(const Labels& subset) {
  absl::MutexLock lock(&mu_);
  size_t removed = 0;
  for (auto it = children_.begin(); it != children_.end();) {
    bool match = true;
    for (const auto& [name, value] : subset) {
      auto label = it->first.find(name);
      if (label == it->first.end() || label->second != value) {
        match = false;
        break;
      }
    }
    if (match) {
      it = children_.erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  return removed;
}

template <typename T>
bool Family<T>::has(const Labels& labels) const {
  Labels merged = options_.constLabels;
  for (const auto& [name, value] : labels) {
    if (!merged.emplace(name, value).second) return false;
  }
  absl::MutexLock lock(&mu_);
  return children_.contains(merged);
}

template <typename T>
void Family<T>::collect(std::vector<ClientMetric>& out) const {
  absl::MutexLock lock(&mu_);
  out.reserve(out.size() + children_.size());
  for (const auto& [labels, child] : children_) {
    ClientMetric metric = collectChild(*child);
    metric.labels = labels;
    out.push_back(std::move(metric));
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

}  // namespace tandem::metrics
