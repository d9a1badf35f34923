#pragma once
// The decode role's P/D service (DESIGN.md §2-§3, docs/pd.md).
//
// Owns the client request. It submits an import request to its engine (the
// reservation is made there), asks P to prefill, and pulls each announced
// layer with gets into its own blocks: nothing ever writes into another
// process's memory. When every get has completed and the checksums match,
// the engine continues with P's first token. Any failure (deadline, P gone,
// checksum, cancel) first cancels D's own outstanding gets and waits for all
// of them to complete, and only then ends the request, so freed blocks can
// never receive a late transfer. Each transfer is a DecodeTransfer state
// machine (pd_transfer.h); this service feeds it events and carries out its
// actions. Failures are typed (kvproto::FailureReason) and counted.
//
// Time comes from the injected clock: deadlines, lease margins and the
// peer's failure window and probes. One watchdog thread waits for the next
// of them (clock.waitUntil), so a FakeClock drives them all in tests.
//
// Thread-safety: public methods may be called from any thread; transport
// callbacks run on the transport's thread, engine callbacks on the loop's.

#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "agent/pd_timings.h"
#include "agent/pd_transport.h"
#include "engine/engine_loop.h"

namespace tandem::agent {

// How a decode-role request was served.
enum class PdPath { kDirect, kDisagg, kFallback };
std::string_view pdPathName(PdPath path);

// What a client request learns about how it was served: the typed
// transfer failure that ended it, if any, and its path (final update).
struct PdInfo {
  std::optional<kvproto::FailureReason> failure;
  PdPath path = PdPath::kDirect;
  std::optional<PdTimings> timings;  // disaggregated requests, once the first token is out
  std::string prefill_peer;          // disaggregated requests: the P that served it ("HOST:PORT")
  std::string moved_from_peer;       // the P it was moved off (not healthy) before that P accepted it
};
using PdUpdateCallback = std::function<void(const engine::RequestUpdate&, const PdInfo&)>;

// A router's decision for one request (routing_headers.h), as D takes it.
struct RouteHint {
  // The prefill agent to use ("HOST:PORT", one of --prefill-peers); empty:
  // this agent picks one.
  std::string prefill_peer;
  // kDirect: compute any uncached suffix of a resident session here (the
  // router judged it short enough); kDisagg: never direct, a P computes
  // the prompt. Unset: this agent's --direct-max-suffix decides.
  std::optional<PdPath> path;
};

class DecodeService {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeService>> start(const PdEnv& env, const PdOptions& options);
  // Completes (or aborts and waits for) every transfer before returning.
  ~DecodeService();

  // Runs `spec` disaggregated: prefill on a peer, decode here (or all here
  // while every peer is unhealthy). `prefill_peer` ("HOST:PORT", the
  // router's x-tandem-prefill-peer) names the P to use; empty, unknown or
  // unhealthy: this agent picks one (PrefillPeers::choose). Returns a
  // handle for cancel().
  uint64_t submit(engine::RequestSpec spec, PdUpdateCallback on_update, const RouteHint& hint = {});
  // OK when `name` is one of this agent's prefill peers (or the peers come
  // from discovery: an unknown name is then ignored); InvalidArgument
  // naming it and the peers otherwise (the request's 400).
  absl::Status checkPrefillPeer(std::string_view name) const;
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
