#pragma once
// The planner's control loop in the operator (docs/planner.md): for every
// InferencePool with spec.autoscaling.enabled, once per its interval,
//
//   1. reads the pool's signals from Prometheus (operator/planner/
//      prometheus_signals.h) and its pods from the API server;
//   2. decides (operator/planner/planner.h), with the replicas' start-up
//      time as measured on the pool's own pods;
//   3. writes spec.prefill.replicas / spec.decode.replicas (merge patch,
//      field manager tandem-planner) when the decision changes them, and
//      status.lastScaling (the decision, its reasons and the inputs it used);
//   4. keeps the Autoscaling condition (True: Active; False: MissingData
//      naming the series, or Paused when autoscaling is off), records an
//      event for every scaling and every notable hold (MissingData,
//      Unschedulable, ManualOverride, SloMissed, Budget), and publishes the
//      routing knobs in the ConfigMap "<pool>-routing" that the routers read;
//   5. exports tandem_planner_* metrics and each pool's SLO targets
//      (tandem_pool_slo_target_seconds{slo}).
//
// Between two intervals, every spec.autoscaling.scaleUpCheck (a third of
// the interval by default), it reads the signals again and acts only where
// a role grows (planner::checkScaleUp): a step in load is met sooner.
//
// It runs inside the Reconciler (only while this operator leads) on the
// reconciler's informers. After a restart the replicas it last wrote are
// read back from status.lastScaling, so a user's edit made meanwhile is
// still recognised as one.
//
// Thread-safety: start() and stop() from one thread; the loop has its own.

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "operator/planner/planner.h"
#include "operator/planner/prometheus_signals.h"
#include "operator/pool.h"
#include "src/common/clock.h"
#include "src/common/log.h"
#include "src/k8s/client.h"
#include "src/k8s/event_recorder.h"
#include "src/k8s/informer.h"
#include "src/metrics/metrics.h"

namespace tandem::op {

struct AutoscalerOptions {
  // For pools whose spec.autoscaling.prometheusUrl is empty; "" : none.
  std::string prometheus_url;
  Duration tick = std::chrono::seconds(1);  // how often due pools are looked for
  Duration query_timeout = std::chrono::seconds(5);
};

// The planner's configuration for a pool: its spec.autoscaling, the pods'
// GPUs, and the start-up time measured on its pods (when there is one).
planner::PlannerConfig plannerConfigFor(const PoolSpec& pool, std::optional<double> measured_startup_s);

// The routing knobs' ConfigMap for a pool: "<pool>-routing", data
// "knobs.json" = {"directMaxSuffixTokens": N, "loadFloorWeight": W,
// "prefillOverloadTokens": T},
// owned by the pool.
nlohmann::json routingConfigMap(const PoolSpec& pool, const nlohmann::json& pool_object,
                                const planner::RoutingKnobs& knobs);

// Runs every query against the Prometheus at `url` (/api/v1/query) and
// returns the answers by query name; a query that failed (unreachable, an
// HTTP error, Prometheus' own error, a malformed answer) is left out and its
// error put in `errors` by query name.
std::map<std::string, std::vector<planner::PromSample>> fetchAnswers(const std::string& url,
                                                                     const std::vector<planner::SignalQuery>& queries,
                                                                     Duration timeout,
                                                                     std::map<std::string, std::string>* errors);

class Autoscaler {
 public:
  // `pools` and `pods` are the reconciler's informers (started, synced);
  // they, `client`, `events` and `registry` outlive the autoscaler.
  Autoscaler(k8s::Client& client, k8s::Informer& pools, k8s::Informer& pods, k8s::EventRecorder& events,
             metrics::Registry& registry, AutoscalerOptions options);
  ~Autoscaler();  // stop()s
  Autoscaler(const Autoscaler&) = delete;
  Autoscaler& operator=(const Autoscaler&) = delete;

  void start();
  void stop();  // idempotent

 private:
  struct PoolState {
    std::string uid;
    planner::PlannerState planner;
    double next_s = 0;  // epoch seconds of its next interval
    double next_check_s = 0;  // of its next check for growth between intervals; 0: none
    bool restored = false;
    std::string condition;  // the Autoscaling condition's reason last written
    bool exported = false;  // its decisions counters exist (at zero) for every role and reason
    std::optional<planner::RoutingKnobs> knobs;
  };

  void loop();
  // One interval's decision, or (`check`) a check for growth between two
  // intervals (planner::checkScaleUp): that writes only when a role grows,
  // and leaves the condition, the routing knobs and the holds' events to
  // the intervals.
  void planPool(const nlohmann::json& pool, PoolState& state, double now_s, bool check);
  // Every query's answer by name; the failed ones are left out (and logged once per pool and query).
  std::map<std::string, std::vector<planner::PromSample>> query(const std::string& url, const std::string& pool_key,
                                                                const std::vector<planner::SignalQuery>& queries);
  absl::Status writeCondition(const PoolSpec& pool, PoolState& state, bool ok, const std::string& reason,
                              const std::string& message, const nlohmann::json& previous_status);

  k8s::Client& client_;
  k8s::Informer& pools_;
  k8s::Informer& pods_;
  k8s::EventRecorder& events_;
  const AutoscalerOptions options_;
  const Logger log_{"planner"};
  metrics::Family<metrics::Gauge>& desired_;
  metrics::Family<metrics::Gauge>& inputs_;
  metrics::Family<metrics::Counter>& decisions_;
  metrics::Family<metrics::Gauge>& slo_targets_;
  std::map<std::string, PoolState> pools_state_;  // by "ns/name"; the loop thread's
  std::map<std::string, std::string> query_errors_;  // "pool query" → the last error logged
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = true;
  std::atomic<bool> stopping_{false};  // checked between pools and before writes
};

}  // namespace tandem::op
