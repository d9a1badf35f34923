#pragma once
// Metrics of the P/D services and their KV transfers (docs/pd.md "Metrics
// and traces"), registered with the agent's labels. Thread-safe (the
// metrics themselves are).

#include <string>
#include <string_view>

#include "agent/pd_timings.h"
#include "agent/peer_health.h"
#include "src/kvproto/kvproto.h"
#include "src/metrics/metrics.h"

namespace tandem::agent {

class PdMetrics {
 public:
  PdMetrics(metrics::Registry& registry, const metrics::Labels& labels);
  void failure(kvproto::FailureReason reason);
  // A control message this side refused (tandem_kv_control_messages_rejected_total):
  // "malformed" (kvproto::decode failed), "unknown_transfer" (names no
  // transfer this side has), "unexpected_type" (not one this role takes),
  // "after_end" (P: a PrefillRequest for a transfer D already ended), and a
  // refused peer's Hello: "incompatible_version", "fingerprint_mismatch",
  // "hash_root_mismatch", "tensor_parallel_mismatch", "kv_dtype_mismatch".
  void rejected(std::string_view reason);
  // A KV connection whose authentication failed (tandem_kv_auth_failures_total;
  // reasons in src/auth/kv_handshake.h AuthFailure).
  void authFailure(std::string_view reason);
  // D, per prefill agent ("HOST:PORT", from its configured set: bounded):
  // a prefill request sent to it, and whether it is healthy.
  void prefillRequested(const std::string& peer);
  // Its state (peer_health.h): tandem_kv_prefill_peer_state{peer, state} is
  // 1 for the current state and 0 for the others; ..._healthy is 1 while healthy.
  void peerState(const std::string& peer, PeerState state);
  void heartbeatAnswered(const std::string& peer, double rtt_seconds);
  // A request moved off a prefill peer that is not healthy before that peer
  // accepted it (`reason`: the peer's state, suspect or unhealthy), or
  // after it missed its deadline ("deadline") or went away ("disconnected"),
  // to another peer or to local prefill (`to`: "peer" or "local").
  void failover(std::string_view reason, std::string_view to);
  // A disaggregated request's TTFT phases (D side), once its first token is out.
  void phases(const PdTimings& t);
  metrics::Counter& bytes;
  metrics::Histogram& seconds;
  metrics::Gauge& inflight;
  metrics::Gauge& leases;
  metrics::Counter& checksum_checked;
  metrics::Counter& gets;

 private:
  metrics::Family<metrics::Counter>& failures_;
  metrics::Family<metrics::Counter>& rejected_;
  metrics::Family<metrics::Counter>& auth_failures_;
  metrics::Family<metrics::Counter>& peer_requests_;
  metrics::Family<metrics::Gauge>& peer_healthy_;
  metrics::Family<metrics::Gauge>& peer_state_;
  metrics::Family<metrics::Histogram>& heartbeat_rtt_;
  metrics::Family<metrics::Counter>& failovers_;
  metrics::Family<metrics::Histogram>& phase_seconds_;
  metrics::Counter& transfer_busy_;
  metrics::Counter& transfer_hidden_;
};

}  // namespace tandem::agent
