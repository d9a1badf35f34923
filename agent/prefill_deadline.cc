#include "agent/prefill_deadline.h"

#include <algorithm>

namespace tandem::agent {

void PrefillRate::record(int64_t tokens, Duration took) {
  if (tokens <= 0 || took <= Duration::zero()) return;
  const double rate = static_cast<double>(tokens) / std::chrono::duration<double>(took).count();
  rate_ = rate_ ? (1 - kWeight) * *rate_ + kWeight * rate : rate;
}

Duration PrefillRate::budget(int64_t tokens) const {
  const double rate = rate_.value_or(options_.assumed_rate);
  const double seconds = options_.slack * static_cast<double>(std::max<int64_t>(tokens, 0)) / rate;
  // Capped far beyond any transfer's ceiling, so the conversion cannot overflow.
  const auto work = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(std::min(seconds, 1e6)));
  return std::max<Duration>(options_.floor, work);
}

}  // namespace tandem::agent
