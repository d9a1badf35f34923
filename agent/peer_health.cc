#include "agent/peer_health.h"

namespace tandem::agent {

void PeerHealth::expire(MonoTime now) {
  while (!failures_.empty() && now - failures_.front() > window_) failures_.pop_front();
}

void PeerHealth::recordFailure() {
  absl::MutexLock lock(&mu_);
  const MonoTime now = clock_.now();
  failures_.push_back(now);
  expire(now);
  if (static_cast<int>(failures_.size()) >= threshold_) unhealthy_ = true;
}

void PeerHealth::recordProbeSuccess() {
  absl::MutexLock lock(&mu_);
  unhealthy_ = false;
  failures_.clear();
}

bool PeerHealth::healthy() {
  absl::MutexLock lock(&mu_);
  expire(clock_.now());
  return !unhealthy_;
}

}  // namespace tandem::agent
