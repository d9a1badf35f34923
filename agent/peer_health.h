#pragma once
// Windowed failure detector for the prefill peer (DESIGN.md §3: "a single
// failure is not a death sentence"): unhealthy after `failures` failures
// within `window`, healthy again after a successful probe. Never a permanent
// verdict. Thread-safe.

#include <chrono>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"

namespace tandem::agent {

class PeerHealth {
 public:
  // `clock` is not owned and must outlive this.
  PeerHealth(int failures, std::chrono::milliseconds window, const Clock& clock)
      : threshold_(failures), window_(window), clock_(clock) {}
  void recordFailure();
  void recordProbeSuccess();
  bool healthy();

 private:
  // Forgets failures older than the window.
  void expire(MonoTime now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int threshold_;
  const std::chrono::milliseconds window_;
  const Clock& clock_;
  absl::Mutex mu_;
  std::deque<MonoTime> failures_ ABSL_GUARDED_BY(mu_);  // within the window, oldest first
  bool unhealthy_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::agent
