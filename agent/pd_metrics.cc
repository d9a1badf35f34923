#include "agent/pd_metrics.h"

namespace tandem::agent {

using kvproto::FailureReason;

PdMetrics::PdMetrics(metrics::Registry& r, const metrics::Labels& labels)
    : bytes(metrics::buildCounter()
                .name("tandem_kv_transfer_bytes_total")
                .help("KV bytes pulled from prefill agents.")
                .labels(labels)
                .registerOn(r)
                .add({})),
      seconds(metrics::buildHistogram()
                  .name("tandem_kv_transfer_seconds")
                  .help("Per request: from the prefill request to the last KV byte landing.")
                  .labels(labels)
                  .buckets(metrics::exponentialBuckets(0.0005, 2, 16))
                  .registerOn(r)
                  .add({})),
      inflight(metrics::buildGauge()
                   .name("tandem_kv_transfer_inflight")
                   .help("KV transfers in progress.")
                   .labels(labels)
                   .registerOn(r)
                   .add({})),
      leases(metrics::buildGauge()
                 .name("tandem_kv_leases_active")
                 .help("Prefill results pinned for a decode agent (prefill side).")
                 .labels(labels)
                 .registerOn(r)
                 .add({})),
      checksum_checked(metrics::buildCounter()
                           .name("tandem_kv_checksum_verified_total")
                           .help("Layer blocks whose checksum was verified after the pull.")
                           .labels(labels)
                           .registerOn(r)
                           .add({})),
      gets(metrics::buildCounter()
               .name("tandem_kv_transfer_gets_total")
               .help("UCX gets (or copies from a peer pool mapped here) that KV pulls became after merging blocks "
                     "adjacent on both sides; one per layer and prefill chunk when both sides' blocks are one run.")
               .labels(labels)
               .registerOn(r)
               .add({})),
      failures_(metrics::buildCounter()
                    .name("tandem_kv_transfer_failures_total")
                    .help("Failed KV transfers by typed reason.")
                    .labels(labels)
                    .registerOn(r)),
      rejected_(metrics::buildCounter()
                    .name("tandem_kv_control_messages_rejected_total")
                    .help("P/D control messages refused, by reason: malformed, unknown_transfer, unexpected_type, "
                          "after_end, incompatible_version, fingerprint_mismatch, hash_root_mismatch, "
                          "tensor_parallel_mismatch, kv_dtype_mismatch.")
                    .labels(labels)
                    .registerOn(r)),
      auth_failures_(metrics::buildCounter()
                         .name("tandem_kv_auth_failures_total")
                         .help("KV connections closed because the peer failed authentication, by reason: "
                               "unknown_key, bad_proof, bad_challenge, unauthenticated, wrong_role, "
                               "incompatible_version, malformed, refused_by_peer, handshake_timeout.")
                         .labels(labels)
                         .registerOn(r)),
      peer_requests_(metrics::buildCounter()
                         .name("tandem_kv_prefill_requests_total")
                         .help("Prefill requests this decode agent sent, by prefill agent (peer).")
                         .labels(labels)
                         .registerOn(r)),
      peer_healthy_(metrics::buildGauge()
                        .name("tandem_kv_prefill_peer_healthy")
                        .help("1 while this decode agent considers the prefill agent (peer) healthy, else 0.")
                        .labels(labels)
                        .registerOn(r)),
      peer_state_(metrics::buildGauge()
                      .name("tandem_kv_prefill_peer_state")
                      .help("1 for the state this decode agent gives the prefill agent (peer): healthy, suspect "
                            "(heartbeats unanswered) or unhealthy (transfer failures); 0 for the others.")
                      .labels(labels)
                      .registerOn(r)),
      heartbeat_rtt_(metrics::buildHistogram()
                         .name("tandem_kv_heartbeat_rtt_seconds")
                         .help("Round trip of the decode agent's heartbeats to each prefill agent (peer).")
                         .labels(labels)
                         .buckets(metrics::exponentialBuckets(0.00005, 2, 18))
                         .registerOn(r)),
      failovers_(
          metrics::buildCounter()
              .name("tandem_kv_prefill_failovers_total")
              .help("Requests moved off a prefill agent, by why (reason: suspect or unhealthy, before it accepted "
                    "them; deadline: it missed its work-proportional deadline; disconnected: it went away) "
                    "and where they went (to: peer, local).")
              .labels(labels)
              .registerOn(r)),
      phase_seconds_(
          metrics::buildHistogram()
              .name("tandem_disagg_ttft_phase_seconds")
              .help("TTFT of disaggregated requests by phase (decode side): prefill (P's queue and compute), "
                    "transfer_exposed (pull time after P's last layer), first_step (D's first token).")
              .labels(labels)
              .buckets(metrics::exponentialBuckets(0.0001, 2, 20))
              .registerOn(r)),
      transfer_busy_(metrics::buildCounter()
                         .name("tandem_kv_transfer_busy_seconds_total")
                         .help("Time during which a request had layer pulls in flight (decode side).")
                         .labels(labels)
                         .registerOn(r)
                         .add({})),
      transfer_hidden_(
          metrics::buildCounter()
              .name("tandem_kv_transfer_hidden_seconds_total")
              .help("The part of tandem_kv_transfer_busy_seconds_total overlapped with the prefill agent's compute.")
              .labels(labels)
              .registerOn(r)
              .add({})) {
  for (auto reason : {FailureReason::kPrefillTimeout, FailureReason::kTransferFailed, FailureReason::kPeerUnhealthy,
                      FailureReason::kLeaseExpired, FailureReason::kCapacity, FailureReason::kChecksumMismatch,
                      FailureReason::kCancelled}) {
    failures_.add({{"reason", std::string(kvproto::failureReasonName(reason))}});
  }
  for (const char* reason : {"suspect", "unhealthy", "deadline", "disconnected"}) {
    for (const char* to : {"peer", "local"}) failovers_.add({{"reason", reason}, {"to", to}});
  }
  for (const char* reason :
       {"malformed", "unknown_transfer", "unexpected_type", "after_end", "incompatible_version", "fingerprint_mismatch",
        "hash_root_mismatch", "tensor_parallel_mismatch", "kv_dtype_mismatch"}) {
    rejected_.add({{"reason", reason}});
  }
  for (const char* reason : {"unknown_key", "bad_proof", "bad_challenge", "unauthenticated", "wrong_role",
                             "incompatible_version", "malformed", "refused_by_peer", "handshake_timeout"}) {
    auth_failures_.add({{"reason", reason}});
  }
}

void PdMetrics::prefillRequested(const std::string& peer) { peer_requests_.add({{"peer", peer}}).increment(); }

void PdMetrics::peerState(const std::string& peer, PeerState state) {
  peer_healthy_.add({{"peer", peer}}).set(state == PeerState::kHealthy ? 1 : 0);
  for (PeerState s : {PeerState::kHealthy, PeerState::kSuspect, PeerState::kUnhealthy}) {
    peer_state_.add({{"peer", peer}, {"state", std::string(peerStateName(s))}}).set(s == state ? 1 : 0);
  }
}

void PdMetrics::heartbeatAnswered(const std::string& peer, double rtt_seconds) {
  heartbeat_rtt_.add({{"peer", peer}}).observe(rtt_seconds);
}

void PdMetrics::failover(std::string_view reason, std::string_view to) {
  failovers_.add({{"reason", std::string(reason)}, {"to", std::string(to)}}).increment();
}

void PdMetrics::rejected(std::string_view reason) { rejected_.add({{"reason", std::string(reason)}}).increment(); }

void PdMetrics::authFailure(std::string_view reason) {
  auth_failures_.add({{"reason", std::string(reason)}}).increment();
}

void PdMetrics::phases(const PdTimings& t) {
  phase_seconds_.add({{"phase", "prefill"}}).observe(t.prefill_ms / 1e3);
  phase_seconds_.add({{"phase", "transfer_exposed"}}).observe((t.transfer_ms - t.transfer_hidden_ms) / 1e3);
  phase_seconds_.add({{"phase", "first_step"}}).observe(t.first_step_ms / 1e3);
  transfer_busy_.increment(t.transfer_ms / 1e3);
  transfer_hidden_.increment(t.transfer_hidden_ms / 1e3);
}

void PdMetrics::failure(FailureReason reason) {
  failures_.add({{"reason", std::string(kvproto::failureReasonName(reason))}}).increment();
}

}  // namespace tandem::agent
