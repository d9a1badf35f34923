#include "agent/peer_health.h"

#include <algorithm>

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
    verdict_seq_ = last_seq_;
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
  const MonoTime now = clock_.now();
  if (!outstanding_.empty()) ++missed_;
  outstanding_.emplace_back(seq, now);
  if (outstanding_.size() > kMaxOutstanding) outstanding_.pop_front();
  last_sent_ = now;
  last_seq_ = seq;
}

std::optional<Duration> PeerHealth::heartbeatAnswered(uint64_t seq) {
  auto it = std::find_if(outstanding_.begin(), outstanding_.end(), [seq](const auto& o) { return o.first == seq; });
  if (it == outstanding_.end()) return std::nullopt;
  if (unhealthy_ && seq <= verdict_seq_) return std::nullopt;
  const Duration rtt = clock_.now() - it->second;
  outstanding_.erase(outstanding_.begin(), it + 1);  // older ones are moot: the peer answered since
  missed_ = 0;
  if (unhealthy_) {
    unhealthy_ = false;
    failures_.clear();
    failures_in_a_row_ = 0;
  }
  return rtt;
}

}  // namespace tandem::agent
