#pragma once
// The router role's Prometheus metrics (DESIGN.md §5 names; docs/routing.md
// lists them), labelled with `pool` and `role`. Latencies are as the client
// sees them: from the request's arrival at the router, queueing, the
// decision and any retry included. Thread-safe (metrics are atomics).

#include <string>
#include <string_view>

#include "src/common/clock.h"
#include "src/metrics/metrics.h"

namespace tandem::agent {

class RouterMetrics {
 public:
  RouterMetrics(metrics::Registry& registry, const std::string& pool);

  // A decision: its path ("direct", "disagg") and how long the policy took.
  void onDecision(std::string_view path, Duration took, bool sticky_hit);
  void onRetry(std::string_view reason);
  void onMigration();
  // A streamed request's first content chunk reached the client.
  void onFirstToken(Duration since_arrival);
  // A streamed request ended after `chunks` content chunks (one per token
  // step of D), the first at `first`, the last at `last`.
  void onStreamEnd(int64_t chunks, MonoTime first, MonoTime last);
  void setStaleWorkers(int64_t n);
  void setUnresponsiveWorkers(int64_t n);
  // An attempt called off (its worker stopped answering) before the client's response started.
  void onCalledOff();
  // A request answered 503: only unresponsive workers could take it in time.
  void onUnserved();
  // Per worker: sessions the policy would send there now and requests in
  // flight from this router.
  void setWorkerLoad(const std::string& worker, int64_t sessions, int64_t in_flight);
  void removeWorker(const std::string& worker);

 private:
  metrics::Labels labels_;
  metrics::Histogram& ttft_;
  metrics::Histogram& tpot_;
  metrics::Family<metrics::Counter>& decisions_;
  metrics::Histogram& decision_seconds_;
  metrics::Family<metrics::Counter>& retries_;
  metrics::Counter& migrations_;
  metrics::Counter& sticky_hits_;
  metrics::Gauge& stale_workers_;
  metrics::Gauge& unresponsive_workers_;
  metrics::Counter& called_off_;
  metrics::Counter& unserved_;
  metrics::Family<metrics::Gauge>& worker_sessions_;
  metrics::Family<metrics::Gauge>& worker_in_flight_;
};

}  // namespace tandem::agent
