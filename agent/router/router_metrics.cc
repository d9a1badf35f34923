#include "agent/router/router_metrics.h"

#include <chrono>

namespace tandem::agent {
namespace {

using metrics::buildCounter;
using metrics::buildGauge;
using metrics::buildHistogram;

double seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

// clang-format off
RouterMetrics::RouterMetrics(metrics::Registry& r, const std::string& pool)
    : labels_{{"pool", pool}, {"role", "router"}},
      ttft_(buildHistogram().name("tandem_router_ttft_seconds").help("Time from the request's arrival at the router to its first streamed token at the client (queueing, decision and retries included).")
                .labels(labels_).buckets(metrics::exponentialBuckets(0.001, 2, 18)).registerOn(r).add({})),
      tpot_(buildHistogram().name("tandem_router_tpot_seconds").help("Mean time between streamed tokens after the first, as the client sees it.")
                .labels(labels_).buckets(metrics::exponentialBuckets(0.0005, 2, 14)).registerOn(r).add({})),
      decisions_(buildCounter().name("tandem_router_decisions_total").help("Routing decisions by path (direct: D computes the suffix, disagg: a P prefills).")
                     .labels(labels_).registerOn(r)),
      decision_seconds_(buildHistogram().name("tandem_router_decision_seconds").help("Time the routing policy took for one decision.")
                            .labels(labels_).buckets(metrics::exponentialBuckets(1e-6, 2, 16)).registerOn(r).add({})),
      retries_(buildCounter().name("tandem_router_retries_total").help("Requests sent to a second worker after the first failed before any token, by the typed reason.")
                   .labels(labels_).registerOn(r)),
      migrations_(buildCounter().name("tandem_router_migrations_total").help("Sessions moved to another decode worker after repeated capacity rejections.")
                      .labels(labels_).registerOn(r).add({})),
      sticky_hits_(buildCounter().name("tandem_router_sticky_hits_total").help("Requests sent to the decode worker where their session was resident.")
                       .labels(labels_).registerOn(r).add({})),
      stale_workers_(buildGauge().name("tandem_router_stale_workers").help("Workers whose state stream is down: their cache is not credited.")
                         .labels(labels_).registerOn(r).add({})),
      unresponsive_workers_(buildGauge().name("tandem_router_unresponsive_workers").help("Decode workers whose state stream went silent or cannot be opened: they get no new requests while another can take them.")
                                .labels(labels_).registerOn(r).add({})),
      called_off_(buildCounter().name("tandem_router_called_off_total").help("Attempts called off before the client's response started because their decode worker stopped answering; each request then goes elsewhere.")
                      .labels(labels_).registerOn(r).add({})),
      unserved_(buildCounter().name("tandem_router_unserved_total").help("Requests answered 503 (decode_workers_unresponsive) because only unresponsive decode workers could take them within --unserved-timeout.")
                    .labels(labels_).registerOn(r).add({})),
      worker_sessions_(buildGauge().name("tandem_router_worker_sessions").help("Sessions resident on each decode worker, as its state stream reports.")
                           .labels(labels_).registerOn(r)),
      worker_in_flight_(buildGauge().name("tandem_router_worker_inflight_requests").help("Requests this router has in flight on each worker.")
                            .labels(labels_).registerOn(r)) {
  // Every path from the start, so rate() sees the first decisions (a series
  // that appears already counted has no increase to show).
  for (const char* p : {"direct", "disagg"}) decisions_.add({{"path", p}});
}
// clang-format on

void RouterMetrics::onDecision(std::string_view path, Duration took, bool sticky_hit) {
  decisions_.add({{"path", std::string(path)}}).increment();
  decision_seconds_.observe(seconds(took));
  if (sticky_hit) sticky_hits_.increment();
}

void RouterMetrics::onRetry(std::string_view reason) { retries_.add({{"reason", std::string(reason)}}).increment(); }

void RouterMetrics::onMigration() { migrations_.increment(); }

void RouterMetrics::onFirstToken(Duration since_arrival) { ttft_.observe(seconds(since_arrival)); }

void RouterMetrics::onStreamEnd(int64_t chunks, MonoTime first, MonoTime last) {
  if (chunks >= 2) tpot_.observe(seconds(last - first) / static_cast<double>(chunks - 1));
}

void RouterMetrics::setStaleWorkers(int64_t n) { stale_workers_.set(static_cast<double>(n)); }

void RouterMetrics::setUnresponsiveWorkers(int64_t n) { unresponsive_workers_.set(static_cast<double>(n)); }

void RouterMetrics::onCalledOff() { called_off_.increment(); }

void RouterMetrics::onUnserved() { unserved_.increment(); }

void RouterMetrics::setWorkerLoad(const std::string& worker, int64_t sessions, int64_t in_flight) {
  worker_sessions_.add({{"worker", worker}}).set(static_cast<double>(sessions));
  worker_in_flight_.add({{"worker", worker}}).set(static_cast<double>(in_flight));
}

void RouterMetrics::removeWorker(const std::string& worker) {
  worker_sessions_.remove(&worker_sessions_.add({{"worker", worker}}));
  worker_in_flight_.remove(&worker_in_flight_.add({{"worker", worker}}));
}

}  // namespace tandem::agent
