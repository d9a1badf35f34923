#include "src/metrics/builder.h"

#include "src/metrics/counter.h"
#include "src/metrics/gauge.h"
#include "src/metrics/histogram.h"
#include "src/metrics/registry.h"

namespace tandem::metrics {

template <typename T>
Family<T>& Builder<T>::registerOn(Registry& registry) const {
  return registry.add<T>(options_);
}

template class Builder<Counter>;
template class Builder<Gauge>;
template class Builder<Histogram>;

}  // namespace tandem::metrics
