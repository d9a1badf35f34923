#include "src/metrics/registry.h"

#include <algorithm>
#include <utility>

#include "src/common/strings.h"
#include "src/metrics/counter.h"
#include "src/metrics/gauge.h"
#include "src/metrics/histogram.h"
#include "src/metrics/validate.h"

namespace tandem::metrics {
namespace {

// Aborts with the family name in the message if `options` cannot be registered.
void validateOptions(MetricType type, const FamilyOptions& options) {
  internal::checkOk(validateMetricName(options.name));
  for (const auto& [name, value] : options.constLabels) {
    if (absl::Status s = validateLabelNameFor(type, name); !s.ok()) {
      internal::fatal(strCat("metric ", options.name, ": ", toStd(s.message())));
    }
  }
  if (absl::Status s = validateBuckets(options.buckets); !s.ok()) {
    internal::fatal(strCat("metric ", options.name, ": ", toStd(s.message())));
  }
  if (type != MetricType::kHistogram && !options.buckets.empty()) {
    internal::fatal(strCat("metric ", options.name, ": buckets given for a ", metricTypeName(type)));
  }
}

template <typename T>
std::unique_ptr<FamilyBase> makeFamily(FamilyOptions options) {
  return std::make_unique<Family<T>>(std::move(options));
}

}  // namespace

const char* metricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

Registry::Registry() = default;
Registry::~Registry() = default;

template <typename T>
Family<T>& Registry::add(FamilyOptions options) {
  return static_cast<Family<T>&>(addBase(T::kType, std::move(options), &makeFamily<T>));
}

FamilyBase& Registry::addBase(MetricType type, FamilyOptions options,
                              std::unique_ptr<FamilyBase> (*make)(FamilyOptions)) {
  validateOptions(type, options);
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = families_.try_emplace(options.name, Entry{type, {}});
  Entry& entry = it->second;
  if (entry.type != type) {
    internal::fatal(strCat("metric ", options.name, " registered as a ", metricTypeName(type),
                           " but already registered as a ", metricTypeName(entry.type)));
  }
  for (const std::unique_ptr<FamilyBase>& family : entry.siblings) {
    if (family->constLabels() != options.constLabels) continue;
    // No buckets means "whatever the family has", so a component can look up
    // a histogram family without repeating its buckets.
    if (!options.buckets.empty() && family->buckets() != options.buckets) {
      internal::fatal(strCat("metric ", options.name, " registered again with different buckets"));
    }
    return *family;
  }
  if (type == MetricType::kHistogram && options.buckets.empty()) options.buckets = defaultLatencyBuckets();
  entry.siblings.push_back(make(std::move(options)));
  return *entry.siblings.back();
}

void Registry::addCollectHook(std::function<void()> hook) {
  absl::MutexLock lock(&mu_);
  hooks_.push_back(std::move(hook));
}

std::vector<MetricFamily> Registry::collect() const {
  absl::MutexLock collectLock(&collectMu_);
  // Copy the hooks and run them without mu_, so a hook may register families
  // or add hooks.
  std::vector<std::function<void()>> hooks;
  {
    absl::MutexLock lock(&mu_);
    hooks = hooks_;
  }
  for (const std::function<void()>& hook : hooks) hook();

  std::vector<MetricFamily> out;
  absl::MutexLock lock(&mu_);
  out.reserve(families_.size());
  for (const auto& [name, entry] : families_) {
    MetricFamily family;
    family.name = name;
    family.type = entry.type;
    family.help = entry.siblings.front()->help();
    for (const std::unique_ptr<FamilyBase>& sibling : entry.siblings) sibling->collect(family.metrics);
    if (family.metrics.empty()) continue;
    if (entry.siblings.size() > 1) {
      std::stable_sort(family.metrics.begin(), family.metrics.end(),
                       [](const ClientMetric& a, const ClientMetric& b) { return a.labels < b.labels; });
    }
    out.push_back(std::move(family));
  }
  return out;
}

template Family<Counter>& Registry::add<Counter>(FamilyOptions);
template Family<Gauge>& Registry::add<Gauge>(FamilyOptions);
template Family<Histogram>& Registry::add<Histogram>(FamilyOptions);

}  // namespace tandem::metrics
