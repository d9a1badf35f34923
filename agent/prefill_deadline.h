#pragma once
// How long a decode agent gives a prefill agent that accepted a request
// (docs/pd.md "Liveness"): in proportion to the work, not a flat timeout.
//
//   budget(tokens) = max(floor, slack × tokens / rate)
//
// `tokens` are the prompt tokens P computes (the prompt less what P had
// cached, from its PrefillAccepted); `rate` is P's measured prefill rate
// (tokens per second from acceptance to the finished transfer, an
// exponentially weighted average over its transfers), or `assumed_rate`
// until the first one finished. The transfer's own ceiling
// (--prefill-timeout, from the request) still holds: the deadline is the
// earlier of the two. A P that answers heartbeats but never finishes is
// thus given up at about `slack` times the time it should have taken, and
// a long prompt on a P that is progressing at its usual pace is not.
//
// Pure; not thread-safe (DecodeService holds its mutex).

#include <chrono>
#include <cstdint>
#include <optional>

#include "src/common/clock.h"

namespace tandem::agent {

struct PrefillDeadlineOptions {
  std::chrono::milliseconds floor{2000};
  double slack = 4.0;            // > 0
  double assumed_rate = 1000.0;  // tokens/s before the first measurement; > 0
};

class PrefillRate {
 public:
  explicit PrefillRate(const PrefillDeadlineOptions& options) : options_(options) {}

  // A transfer of `tokens` computed tokens took `took` from acceptance to
  // the end. Ignored when either is not positive (nothing was computed: a
  // whole-prompt cache hit says nothing about the rate).
  void record(int64_t tokens, Duration took);
  // The measured rate (tokens/s), once a transfer finished.
  std::optional<double> measured() const { return rate_; }
  // The time P gets for `tokens` computed tokens.
  Duration budget(int64_t tokens) const;

 private:
  static constexpr double kWeight = 0.25;  // of the newest measurement
  PrefillDeadlineOptions options_;
  std::optional<double> rate_;
};

}  // namespace tandem::agent
