#pragma once
// The InferencePool reconciler (docs/operator.md "Reconciler"):
// level-triggered and idempotent. Informers follow the pools and every
// object the operator manages (label app.kubernetes.io/managed-by=
// tandem-operator), a change to any of them queues its pool, and one
// reconcile of a pool
//
//   1. reads the pool (gone: nothing to do, its children go with it through
//      their owner references);
//   2. parses it (operator/pool.h); an invalid spec becomes Degraded with
//      the field's message and a Warning event, once per generation;
//   3. server-side-applies each child (operator/children.h, field manager
//      tandem-operator, forced) whose observed object does not already hold
//      what it should (no write when nothing differs); a Deployment whose
//      replicas were edited directly is reverted with a Warning event
//      saying the pool is the source of truth;
//   4. writes the status computed from the observed children and pods
//      (operator/pool_status.h) when it differs from the stored one.
//
// Pools with spec.autoscaling.enabled are sized by the planner
// (operator/autoscaler.h), which runs on the same informers.
//
// Apart from reconciles, every deletion_cost_period the decode pods'
// pod-deletion-cost annotation is brought up to date from their agents'
// load (operator/deletion_cost.h), so a scale-down removes the emptiest.
//
// Events on every decision (Created, Scaled, Updated, ChildEdited,
// InvalidSpec). Metrics: tandem_operator_reconcile_total{result}
// (success, error, invalid), tandem_operator_reconcile_seconds, and each
// pool's replicas as its status has them, tandem_pool_replicas and
// tandem_pool_ready_replicas {namespace, pool, role} (dashboards compare them
// with the planner's tandem_planner_desired_replicas).
//
// Thread-safety: start() and stop() from one thread; the work runs on the
// reconciler's own threads.

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "operator/autoscaler.h"
#include "src/common/clock.h"
#include "src/common/log.h"
#include "src/k8s/client.h"
#include "src/k8s/event_recorder.h"
#include "src/k8s/informer.h"
#include "src/k8s/work_queue.h"
#include "src/metrics/metrics.h"

namespace tandem::op {

struct ReconcilerOptions {
  std::string ns;  // "" : every namespace
  int workers = 2;
  Duration resync = std::chrono::minutes(5);  // every pool looked at again this often
  std::string identity = "tandem-operator";   // reportingInstance of its events
  // Decode pods' controller.kubernetes.io/pod-deletion-cost refreshed from
  // their agents' /metrics this often (operator/deletion_cost.h); 0: never.
  Duration deletion_cost_period = std::chrono::seconds(3);
  // The planner (operator/autoscaler.h) for pools with autoscaling on.
  AutoscalerOptions autoscaler;
};

k8s::ResourceRef inferencePoolsResource();

// Whether `observed` already holds every field `desired` sets (objects:
// each key, recursively; lists: the same length, element by element;
// numbers compared by value). Fields the server added do not matter.
bool holds(const nlohmann::json& observed, const nlohmann::json& desired);

class Reconciler {
 public:
  // Starts the informers and waits (up to 30 s) until they have listed.
  static absl::StatusOr<std::unique_ptr<Reconciler>> start(k8s::Client& client, metrics::Registry& registry,
                                                           ReconcilerOptions options);
  ~Reconciler();  // stop()s
  Reconciler(const Reconciler&) = delete;
  Reconciler& operator=(const Reconciler&) = delete;

  void stop();  // idempotent

 private:
  Reconciler(k8s::Client& client, metrics::Registry& registry, ReconcilerOptions options);
  absl::Status begin();
  void work();
  // One pass over the pool `key` ("ns/name").
  absl::Status reconcile(const std::string& key, std::string* result);
  void enqueueOwner(const nlohmann::json& child);
  // The pool key's Secret exists (children.h poolKeySecret): created once
  // with a fresh random key, never written again (a user's rotation
  // stands). Looked up again at most every kPoolKeyRecheck per pool.
  absl::Status ensurePoolKey(const PoolSpec& pool, const k8s::ObjectReference& ref);
  static constexpr Duration kPoolKeyRecheck = std::chrono::minutes(5);
  void refreshDeletionCosts();

  k8s::Client& client_;
  metrics::Registry& registry_;
  const ReconcilerOptions options_;
  const Logger log_{"operator"};
  metrics::Family<metrics::Counter>& reconciles_;
  metrics::Histogram& reconcile_seconds_;
  metrics::Family<metrics::Gauge>& pool_replicas_;
  metrics::Family<metrics::Gauge>& pool_ready_replicas_;
  std::unique_ptr<k8s::EventRecorder> events_;
  k8s::WorkQueue queue_;
  std::unique_ptr<k8s::Informer> pools_, deployments_, services_, config_maps_, service_accounts_, roles_,
      role_bindings_, pods_;
  std::vector<std::thread> workers_;
  std::thread costs_;
  std::unique_ptr<Autoscaler> autoscaler_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopped_ = false;
  // The uid of each child this operator created, until the informers'
  // cache shows it: a reconcile that runs before the cache has caught up
  // applies the child again and must not report it created a second time.
  // A child deleted meanwhile comes back with another uid: reported.
  absl::Mutex created_mu_;
  absl::flat_hash_map<std::string, std::string> created_ ABSL_GUARDED_BY(created_mu_);
  // Per pool key ("ns/name"): its uid when its key Secret was last seen, and
  // when to look again.
  struct PoolKeySeen {
    std::string uid;
    MonoTime next_check;
  };
  absl::flat_hash_map<std::string, PoolKeySeen> pool_keys_seen_ ABSL_GUARDED_BY(created_mu_);
};

}  // namespace tandem::op
