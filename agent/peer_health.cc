#include "agent/peer_health.h"

namespace tandem::agent {

std::string_view peerStateName(PeerState s) {
  switch (s) {
    case PeerState::kHealthy:
      return "healthy";
    case PeerState::kSuspect:
      return "suspect";
    case PeerState::kUnhealthy:
      return "unhealthy";
  }
  return "healthy";
}

void PeerHealth::expire(MonoTime now) {
  while (!failures_.empty() && now - failures_.front() > options_.window) failures_.pop_front();
}

PeerState PeerHealth::state() {
  if (unhealthy_) return PeerState::kUnhealthy;
  if (missed_ >= options_.missed_heartbeats) return PeerState::kSuspect;
  return PeerState::kHealthy;
}

void PeerHealth::recordFailure() {
  const MonoTime now = clock_.now();
  failures_.push_back(now);
  expire(now);
  ++failures_in_a_row_;
  if (!unhealthy_ &&
      (static_cast<int>(failures_.size()) >= options_.failures || failures_in_a_row_ >= options_.failures)) {
    unhealthy_ = true;
    // Only a probe sent after the verdict may end it, not the answer to a
    // heartbeat already on its way.
    outstanding_.reset();
  }
}

void PeerHealth::recordSuccess() { failures_in_a_row_ = 0; }

MonoTime PeerHealth::nextHeartbeat(bool busy) {
  if (!last_sent_) return MonoTime::min();  // due at once
  const PeerState s = state();
  const std::chrono::milliseconds interval = s == PeerState::kUnhealthy              ? options_.probe_interval
                                             : busy || s == PeerState::kSuspect ? options_.heartbeat_interval
                                                                                 : options_.idle_heartbeat_interval;
  return *last_sent_ + interval;
}

void PeerHealth::heartbeatSent(uint64_t seq) {
  if (outstanding_) ++missed_;
  outstanding_ = seq;
  last_sent_ = clock_.now();
}

std::optional<Duration> PeerHealth::heartbeatAnswered(uint64_t seq) {
  if (!outstanding_ || seq != *outstanding_ || !last_sent_) return std::nullopt;
  outstanding_.reset();
  missed_ = 0;
  if (unhealthy_) {
    unhealthy_ = false;
    failures_.clear();
    failures_in_a_row_ = 0;
  }
  return clock_.now() - *last_sent_;
}

}  // namespace tandem::agent
