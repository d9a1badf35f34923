#pragma once
// The router's subscriptions to its workers' state streams
// (`GET /internal/v1/events`, docs/routing.md): one per configured worker,
// each feeding snapshots and deltas into the RouterCore. A stream that
// breaks, skips a sequence number or changes epoch is re-opened and starts
// from a fresh snapshot; while it is down the worker is marked stale (no
// cache credit; still routable) and that is logged once. A worker whose
// stream goes silent for `stale_after`, or that cannot be reached, is
// unresponsive (RouterCore::setResponsive; `on_liveness` is told) until a
// snapshot comes again.
//
// Thread-safe; the destructor stops every subscription.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/agent_config.h"
#include "agent/router/router_core.h"
#include "src/common/clock.h"
#include "src/common/log.h"

namespace tandem::agent {

class WorkerFeeds {
 public:
  // `on_liveness(worker, unresponsive)`: runs on a feed's thread when a
  // worker becomes unresponsive (true) or answers again (false).
  using LivenessCallback = std::function<void(const std::string& worker, bool unresponsive)>;
  // `authorization`: the Authorization header of each subscription (the
  // pool's token; WorkerStreamOptions::authorization).
  WorkerFeeds(RouterCore& core, const Clock& clock, Logger& log, Duration stale_after, LivenessCallback on_liveness,
              std::function<std::string()> authorization = {});
  ~WorkerFeeds();

  // Subscribes to the agent whose HTTP API is at `address`.
  void add(const HostPort& address, routing::WorkerRole role);
  // Makes the subscriptions for `role` exactly `addresses` (discovery):
  // new ones are added; one no longer listed is closed and its worker
  // leaves the RouterCore (RouterCore::removeWorker).
  void sync(routing::WorkerRole role, const std::vector<HostPort>& addresses);

 private:
  struct Feed;
  void addLocked(const HostPort& address, routing::WorkerRole role) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  RouterCore& core_;
  const Clock& clock_;
  Logger& log_;
  const Duration stale_after_;
  const LivenessCallback on_liveness_;
  const std::function<std::string()> authorization_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Feed>> feeds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::agent
