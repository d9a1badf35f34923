#pragma once
// The router's routing state behind one lock: the workers' state
// (routing::ClusterState, fed by their event streams), the router's own
// in-flight assignments (routing::InFlight) and the policy. HTTP threads ask
// it for decisions and report how each ended; the stream clients feed it.
// Everything a decision reads is in here, so two decisions never see a
// half-applied update, and a burst of requests sees each earlier
// assignment at once (InFlight).
//
// Thread-safe.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"
#include "src/routing/cluster_state.h"
#include "src/routing/in_flight.h"
#include "src/routing/policy.h"

namespace tandem::agent {

// How the router hashes prompts: the decode workers' block size and chain root.
struct HashSpec {
  int block_size = 0;
  BlockHash root{0};
};

// What the router learns of a worker beyond the policy's view: where to
// reach it. From the configuration (HTTP) and its snapshot (KV listener).
struct WorkerAddress {
  std::string http;  // "http://host:port"
  std::string kv;    // "host:port" of its KV listener (prefill workers; "" when unknown)
};

class RouterCore {
 public:
  struct Options {
    // A decode worker that failed this many requests within the window
    // (unreachable) gets no new requests until its stream delivers a
    // snapshot again (DESIGN.md §3: windowed, never permanent).
    int unhealthy_failures = 3;
    std::chrono::milliseconds failure_window{10000};
  };
  RouterCore(std::unique_ptr<routing::Policy> policy, const Clock& clock, Options options);
  RouterCore(std::unique_ptr<routing::Policy> policy, const Clock& clock) : RouterCore(std::move(policy), clock, {}) {}
  ~RouterCore();

  // ---- the workers' event streams ----
  absl::Status applySnapshot(const routing::WorkerSnapshot& snapshot, std::string http_address,
                             std::string kv_address);
  // kFailedPrecondition (routing::needsResnapshot): take a fresh snapshot.
  absl::Status applyDelta(std::string_view worker, const routing::WorkerDelta& delta);
  void markStale(std::string_view worker);
  // The worker left the router's set (discovery no longer lists it): no
  // new decision names it; requests already sent to it end as they end.
  void removeWorker(std::string_view worker);
  // The worker's stream went silent or cannot be opened (false), or a
  // snapshot came again (true): docs/routing.md "Liveness". An
  // unresponsive worker gets no request while a responsive one can take it.
  void setResponsive(std::string_view worker, bool responsive);
  bool responsive(std::string_view worker) const;
  // Since when `worker` has been unresponsive; nullopt while it answers.
  std::optional<MonoTime> unresponsiveSince(std::string_view worker) const;
  // Whether a decode worker other than `worker` answers (and is healthy):
  // somewhere to move a request `worker` has not started.
  bool otherResponsiveDecodeWorker(std::string_view worker) const;

  // ---- decisions ----
  // The block size and root to hash prompts with; nullopt until a decode
  // worker's snapshot arrived.
  std::optional<HashSpec> hashSpec() const;
  // New routing weights and thresholds from now on (the planner's knobs);
  // InvalidArgument naming the knob when one is out of range.
  absl::Status setRouterConfig(const routing::RouterConfig& config);
  // One routed request: its decision, counted in the router's in-flight
  // view (InFlight) from route() until D has taken it into its own
  // accounting (admitted(): its first token arrived) or it ended.
  struct Assignment {
    routing::Decision decision;
    bool in_flight = true;
  };
  // A decision for `request`, never on a worker in `avoid` (the worker a
  // retry moves away from), nor on an unresponsive one unless
  // `allow_unresponsive` (the last resort when no other worker can take
  // it), or why there is none.
  std::variant<Assignment, routing::NoWorker> route(const routing::RouteRequest& request,
                                                    const std::vector<std::string>& avoid = {},
                                                    bool allow_unresponsive = false);
  std::optional<WorkerAddress> address(std::string_view worker) const;
  void admitted(Assignment& a);
  // Exactly one of these per assignment.
  void finished(const routing::RouteRequest& request, Assignment& a);
  void rejected(const routing::RouteRequest& request, Assignment& a, routing::RejectReason reason);
  // D could not be reached: ends the assignment and counts a failure of D.
  void unreachable(const routing::RouteRequest& request, Assignment& a);

  // ---- for /readyz and metrics ----
  bool hasDecodeSnapshot() const;
  int64_t numStale() const;
  int64_t numUnresponsive() const;  // decode-capable workers only
  struct WorkerLoadView {
    std::string name;
    int64_t sessions = 0;
    int64_t in_flight = 0;
  };
  std::vector<WorkerLoadView> workerLoads() const;

 private:
  void release(Assignment& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `worker` could not be reached too often within the failure window.
  bool failedTooOften(const std::string& worker, MonoTime now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock& clock_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::unique_ptr<routing::Policy> policy_ ABSL_GUARDED_BY(mu_);
  routing::ClusterState cluster_ ABSL_GUARDED_BY(mu_);
  routing::InFlight in_flight_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, WorkerAddress> addresses_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::vector<MonoTime>> failures_ ABSL_GUARDED_BY(mu_);  // within the window
  absl::flat_hash_map<std::string, MonoTime> unresponsive_since_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::agent
