#pragma once
// An InferencePool's status, computed from what is observed (the children
// and their pods as the API server has them now), never from what the
// operator last wrote (docs/operator.md "Status"):
//
//   observedGeneration        the pool's generation this status describes
//   prefill|decode|router     {replicas: desired, readyReplicas, updatedReplicas, summary: "ready/desired"}
//   endpoint                  the router Service's "<clusterIP>:8000"
//   conditions
//     Ready        True (AllReplicasReady) once every role has its desired
//                  replicas ready and updated; else False with the first of
//                  InvalidSpec, Unschedulable (names the role and the
//                  scheduler's message), Creating, RollingOut, NotReady
//     Progressing  True while a role converges (RollingOut, Scaling);
//                  False when converged (Stable) or blocked (Unschedulable,
//                  InvalidSpec)
//     Degraded     True (InvalidSpec, the message names the field) when the
//                  spec cannot be made into children; False (AsExpected)
//
//     Autoscaling  (written by the planner, kept here as it is)
//
// status.lastScaling is the planner's alone: not part of what is computed
// here (and the reconciler's merge patch leaves it).
//
// A condition's lastTransitionTime moves only when its status does.
//
// Pure.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/pool.h"

namespace tandem::op {

struct Observed {
  std::optional<nlohmann::json> deployments[3];  // by Role
  std::vector<nlohmann::json> pods[3];           // each role's pods (its selector), deleting ones included
  std::optional<nlohmann::json> router_service;
};

// `pool` may be null-initialised (only name and generation used) when the
// spec is invalid: `spec_error` then says why.
nlohmann::json computeStatus(const PoolSpec& pool, const Observed& observed, const nlohmann::json& previous_status,
                             const std::string& now, const std::string& spec_error = "");

}  // namespace tandem::op
