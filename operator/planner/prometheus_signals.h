#pragma once
// The planner's signals from the Prometheus HTTP API (docs/planner.md,
// "Signals"): the PromQL for one pool, the parsing of /api/v1/query
// answers, and their assembly with the pool's pods into planner::Signals.
// Pure: the operator does the HTTP (operator/autoscaler.h).
//
// Series are the agents' and routers' own (agent/agent_metrics.cc,
// agent/router/router_metrics.cc), selected by their `pool` label; per
// replica by the `pod` label Prometheus attaches to a pod's targets (a
// PodMonitor, kubernetes_sd relabelling, or the local cluster's file).
//
// A query whose answer is empty because nothing happened (no requests in
// the window: a histogram quantile of nothing) is "no data"; an empty
// answer from one marked `required` means the series is not there at all
// (agents not scraped, a wrong pool label, Prometheus down) and is named
// in Signals::missing, so nothing is decided on it.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "operator/planner/planner.h"

namespace tandem::planner {

struct SignalQuery {
  std::string name;    // what it measures, e.g. "ttft_p95"
  std::string promql;
  std::string series;  // the series it needs, named when it is missing
  bool required = false;
};

// The queries for pool `pool`, rates over `window_s` (at least 4 scrape
// intervals makes rate() robust; the operator uses twice the planner's
// interval, at least 10 s).
std::vector<SignalQuery> signalQueries(const std::string& ns, const std::string& pool, double window_s);

struct PromSample {
  std::map<std::string, std::string> labels;
  double value = 0;  // NaN and ±Inf are dropped when parsed
};

// An /api/v1/query answer ("vector" or "scalar" result). Errors name what
// was wrong: status "error" (with Prometheus' errorType and error), another
// result type, a malformed sample.
absl::StatusOr<std::vector<PromSample>> parseQueryResponse(const nlohmann::json& body);

// One pod of the pool as the API server has it.
struct PodInfo {
  std::string name;
  PlanRole role = PlanRole::kPrefill;
  bool ready = false;
  double ready_since_s = 0;  // the Ready condition's lastTransitionTime (epoch seconds)
  double created_s = 0;      // creationTimestamp
  bool unschedulable = false;
  bool deleting = false;  // deletionTimestamp set: not counted
  int64_t restarts = 0;   // its containers' restarts
};

// A start-up longer than this is taken as this long (a pod whose readiness
// moved for another reason).
inline constexpr double kMaxStartupS = 1800;

// Assembles one interval's signals at `now_s` (epoch seconds) from the
// answers by query name (a query that failed outright is absent from
// `answers` and named in `missing`) and the pods.
Signals assembleSignals(const std::vector<SignalQuery>& queries,
                        const std::map<std::string, std::vector<PromSample>>& answers,
                        const std::vector<PodInfo>& pods, int32_t spec_prefill, int32_t spec_decode, double now_s);

// The start-up time of the role's replicas as measured: the longest
// creation-to-Ready time among its pods that became Ready without a
// container restart, at most kMaxStartupS. nullopt: none did.
std::optional<double> measuredStartup(const std::vector<PodInfo>& pods, PlanRole role);

}  // namespace tandem::planner
