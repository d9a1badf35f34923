#pragma once
// A prefill peer's health as a decode agent sees it (docs/pd.md "Liveness";
// DESIGN.md §3: "a single failure is not a death sentence"):
//
//   kHealthy ──`missed_heartbeats` heartbeats unanswered in a row──▶ kSuspect
//   kHealthy, kSuspect ──`failures` transfer failures within `window`,
//                         or `failures` in a row without a success──▶ kUnhealthy
//   kSuspect, kUnhealthy ──an answer to the latest heartbeat──▶ kHealthy (failures forgotten)
//
// Only a healthy peer gets new work. D pings every peer (Ping, a sequence
// number as its transfer id; P answers from its transport thread, not its
// engine loop, so a busy P still answers): every `heartbeat_interval` while
// transfers are in flight to it or it is suspect, every
// `idle_heartbeat_interval` while idle, and every `probe_interval` once
// unhealthy. Each heartbeat sent while an earlier one is still unanswered
// is a miss; an answer to any outstanding heartbeat resets the count, so a
// P whose round trip is longer than the interval (but shorter than
// `missed_heartbeats` intervals) stays healthy. Never a permanent verdict:
// an unhealthy peer keeps being probed and its first answer brings it
// back; an answer to a heartbeat sent before the verdict does not, so a
// late answer cannot undo a verdict that a probe has not.
//
// Pure state on an injected clock. Not thread-safe: the owner serialises
// calls (DecodeService holds its mutex).

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string_view>
#include <utility>

#include "src/common/clock.h"

namespace tandem::agent {

enum class PeerState { kHealthy, kSuspect, kUnhealthy };
std::string_view peerStateName(PeerState s);  // "healthy", "suspect", "unhealthy"

struct PeerHealthOptions {
  int failures = 3;
  std::chrono::milliseconds window{10000};
  int missed_heartbeats = 3;
  std::chrono::milliseconds heartbeat_interval{500};
  std::chrono::milliseconds idle_heartbeat_interval{2000};
  std::chrono::milliseconds probe_interval{1000};
};

class PeerHealth {
 public:
  // `clock` is not owned and must outlive this.
  PeerHealth(const PeerHealthOptions& options, const Clock& clock) : options_(options), clock_(clock) {}

  PeerState state();
  bool healthy() { return state() == PeerState::kHealthy; }

  // Transfer outcomes that say something about the peer.
  void recordFailure();
  void recordSuccess();

  // When the next heartbeat is due; `busy`: transfers are in flight to it.
  MonoTime nextHeartbeat(bool busy);
  // Heartbeat `seq` went out (sequence numbers increase).
  void heartbeatSent(uint64_t seq);
  // The peer answered heartbeat `seq`: its round trip when `seq` is still
  // outstanding (and, while unhealthy, was sent after the verdict), else
  // nothing (ignored: answered already, too old, or unknown).
  std::optional<Duration> heartbeatAnswered(uint64_t seq);

  int numMissedHeartbeats() const { return missed_; }

 private:
  // Forgets failures older than the window.
  void expire(MonoTime now);

  const PeerHealthOptions options_;
  const Clock& clock_;
  std::deque<MonoTime> failures_;  // within the window, oldest first
  int failures_in_a_row_ = 0;
  bool unhealthy_ = false;
  int missed_ = 0;
  std::optional<MonoTime> last_sent_;
  uint64_t last_seq_ = 0;
  uint64_t verdict_seq_ = 0;  // the last heartbeat sent before the unhealthy verdict
  // Unanswered heartbeats (sequence number, when sent), oldest first;
  // bounded: a peer silent that long is suspect anyway.
  std::deque<std::pair<uint64_t, MonoTime>> outstanding_;
  static constexpr size_t kMaxOutstanding = 64;
};

}  // namespace tandem::agent
