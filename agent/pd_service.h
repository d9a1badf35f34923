#pragma once
// The P/D roles of the agent on top of the UCX transport (DESIGN.md §2-§3).
//
// Prefill side (PrefillService): listens on the KV port. For each
// PrefillRequest it runs a leased prefill in its engine, answers
// PrefillAccepted with the blocks that will hold the prompt's KV, sends
// LayerReady (with a checksum per block) as each layer is written, then
// PrefillDone with the first token. The KV stays pinned until D's Release,
// D's disconnect, or lease expiry — a dead D cannot leak P memory.
//
// Decode side (DecodeService): owns the client request. It submits an
// import request to its engine (the reservation is made there), asks P to
// prefill, and pulls each announced layer with UCX gets into its own
// blocks — nothing ever writes into another process's memory. When every
// get has completed and the checksums match, the engine continues with P's
// first token. Any failure (deadline, P gone, checksum, cancel) first
// cancels D's own outstanding gets and waits for all of them to complete,
// and only then ends the request — so freed blocks can never receive a late
// transfer. Failures are typed (kvproto::FailureReason) and counted.
//
// Thread-safety: public methods may be called from any thread; transport
// callbacks run on the transport's thread, engine callbacks on the loop's.

#include <chrono>
#include <deque>
#include <mutex>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "agent/transport/ucx_transport.h"
#include "engine/engine_loop.h"
#include "src/kvproto/kvproto.h"
#include "src/metrics/metrics.h"

namespace tandem::agent {

struct PdOptions {
  transport::TransportOptions transport;
  std::chrono::milliseconds lease_ttl{30000};       // P: how long KV stays pinned without a Release
  std::chrono::milliseconds prefill_timeout{60000}; // D: P must deliver all layers within this
  double checksum_rate = 1.0;                       // D: fraction of transfers whose checksums are verified
  std::string peer_host;                            // D: the prefill agent
  int peer_port = 8200;
  int direct_max_suffix_tokens = 256;               // D: direct-to-D when the session is resident and at most this much is new
  // D: the prefill peer is unhealthy after this many failures within the
  // window; it is probed every probe_interval and healthy again on answer.
  int unhealthy_failures = 3;
  std::chrono::milliseconds failure_window{10000};
  std::chrono::milliseconds probe_interval{1000};

  // Fault injection, for tests only (agent flags --fault-*; never set in
  // production). Each is a hook on the real code path, not a mock.
  struct Faults {
    std::chrono::milliseconds layer_delay{0};  // P: announce each layer this much later
    std::chrono::milliseconds get_delay{0};    // D: issue each layer's gets this much later
    std::chrono::milliseconds get_complete_delay{0};  // D: handle each finished layer pull this much later
    int fail_first_transfers = 0;              // P: abort this many transfers, then behave
  } faults;
};

// How a decode-role request was served.
enum class PdPath { kDirect, kDisagg, kFallback };
std::string_view pdPathName(PdPath path);

// Windowed failure detector: unhealthy after N failures within T, healthy
// again after a successful probe. Never a permanent verdict. Thread-safe.
class PeerHealth {
 public:
  PeerHealth(int failures, std::chrono::milliseconds window) : threshold_(failures), window_(window) {}
  void recordFailure(MonoTime now);
  void recordProbeSuccess();
  bool healthy(MonoTime now);

 private:
  std::mutex mu_;
  int threshold_;
  std::chrono::milliseconds window_;
  std::deque<MonoTime> failures_;  // guarded by mu_
  bool unhealthy_ = false;         // guarded by mu_
};

// Where a disaggregated request's time to first token went, on D's clock.
struct PdTimings {
  double prefill_ms = 0;          // D asked P → P's last layer announcement arrived (P queue + compute)
  double transfer_ms = 0;         // time with at least one layer being pulled
  double transfer_hidden_ms = 0;  // of that, before P's last announcement: overlapped with P's compute
  double first_step_ms = 0;       // all KV in D → D emitted the first token
};

// Metrics of the transport, registered with the agent's labels.
class PdMetrics {
 public:
  PdMetrics(metrics::Registry& registry, const metrics::Labels& labels);
  void failure(kvproto::FailureReason reason);
  // A control message this side refused (tandem_kv_control_messages_rejected_total):
  // "malformed" (kvproto::decode failed), "unknown_transfer" (names no
  // transfer this side has), "unexpected_type" (not one this role takes),
  // "after_end" (P: a PrefillRequest for a transfer D already ended),
  // "unknown_peer" (D: from a connection other than the one to its P).
  void rejected(std::string_view reason);
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
  metrics::Family<metrics::Histogram>& phase_seconds_;
  metrics::Counter& transfer_busy_;
  metrics::Counter& transfer_hidden_;
};

class PrefillService {
 public:
  // `on_finished` (optional) sees the final update of every prefill, on the
  // engine thread, for the agent's request metrics and traces.
  static absl::StatusOr<std::unique_ptr<PrefillService>> start(
      engine::EngineLoop& loop, const PdOptions& options, PdMetrics& metrics,
      std::function<void(const engine::RequestUpdate&)> on_finished = nullptr);
  ~PrefillService();
  int port() const;

  struct Impl;

 private:
  explicit PrefillService(std::shared_ptr<Impl> impl);
  // Shared with the engine requests' callbacks, which may run after this
  // service is gone (the engine loop ends its requests when it stops).
  std::shared_ptr<Impl> impl_;
};

// What a client request learns about how it was served: the typed
// transfer failure that ended it, if any, and its path (final update).

struct PdInfo {
  std::optional<kvproto::FailureReason> failure;
  PdPath path = PdPath::kDirect;
  std::optional<PdTimings> timings;  // disaggregated requests, once the first token is out
};
using PdUpdateCallback = std::function<void(const engine::RequestUpdate&, const PdInfo&)>;

class DecodeService {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeService>> start(engine::EngineLoop& loop, const PdOptions& options,
                                                              PdMetrics& metrics);
  // Completes (or aborts and waits for) every transfer before returning.
  ~DecodeService();

  // Runs `spec` disaggregated: prefill on the peer, decode here. Returns a
  // handle for cancel().
  uint64_t submit(engine::RequestSpec spec, PdUpdateCallback on_update);
  void cancel(uint64_t handle);
  // The KV listener's port (D only pulls, but listens like every agent).
  int port() const;

  struct Impl;

 private:
  explicit DecodeService(std::shared_ptr<Impl> impl);
  // Shared with the engine requests' callbacks (see PrefillService).
  std::shared_ptr<Impl> impl_;
};

}  // namespace tandem::agent
