#pragma once
// A routing policy: given a request, the workers' state and the router's own
// in-flight assignments, pick the decode worker (and the prefill worker and
// path). The tandem policy (tandem_policy.h) and the baselines of
// tandem-replay (round robin, least load, cache aware) implement it, so the
// router role and the replay tool drive any of them the same way.
//
// Call order for one request: route(); if a Decision came back and the
// request was sent, onAssigned(); then exactly one of onFinished() (D served
// it) or onRejected() (D refused it, with its typed reason). A policy may keep
// state across requests in these callbacks (e.g. rejection counts for
// migration); nothing it keeps may be needed for two router replicas to agree
// on a session's owner (that follows from worker state, docs/routing.md).
//
// Not thread-safe: one owner, like ClusterState.

#include <string_view>

#include "src/routing/cluster_state.h"
#include "src/routing/decision.h"
#include "src/routing/in_flight.h"
#include "src/routing/reject_reason.h"
#include "src/routing/route_request.h"
#include "src/routing/router_config.h"

namespace tandem::routing {

class Policy {
 public:
  virtual ~Policy() = default;

  virtual std::string_view name() const = 0;
  virtual RouteResult route(const RouteRequest& request, const ClusterState& cluster, const InFlight& in_flight) = 0;

  // Takes new weights and thresholds while it runs (the planner's routing
  // knobs); false for a policy that has none.
  virtual bool setConfig(const RouterConfig& config) { return false; }

  virtual void onAssigned(const RouteRequest& request, const Decision& decision) {}
  virtual void onFinished(const RouteRequest& request, const Decision& decision) {}
  virtual void onRejected(const RouteRequest& request, const Decision& decision, RejectReason reason) {}
};

}  // namespace tandem::routing
