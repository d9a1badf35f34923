#pragma once
// What the ReplicaSet and Deployment controllers decide, as pure functions
// of what the informers hold (docs/local-cluster.md). The controller
// manager (controller_manager.h) reads its caches, calls these, and writes.
//
// ReplicaSet: keeps `spec.replicas` active pods (not terminal, not being
// deleted) among the pods it controls; surplus pods go in kube-controller-
// manager's order: unscheduled before scheduled, pending before running,
// not ready before ready, lower `controller.kubernetes.io/pod-deletion-cost`
// first, more restarts first, newer first.
//
// Deployment: one ReplicaSet per pod template, named
// `<deployment>-<pod-template-hash>` and labelled with the hash;
// RollingUpdate within maxSurge / maxUnavailable (ints or percentages,
// surge rounded up, unavailable down; both 0 means 1 unavailable),
// Recreate (old pods gone before new ones start); old ReplicaSets beyond
// revisionHistoryLimit deleted; status (replicas, updated, ready,
// available, unavailable, observedGeneration, Available and Progressing
// conditions with ProgressDeadlineExceeded) as `kubectl rollout status`
// reads it.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/common/clock.h"

namespace tandem::kubelet {

// metav1.LabelSelector (matchLabels, matchExpressions with In, NotIn,
// Exists, DoesNotExist) against an object's labels. An empty or missing
// selector matches nothing (as a controller treats it).
bool selectorMatches(const nlohmann::json& selector, const nlohmann::json& labels);

// The pod a controller owns: ownerReferences has controller=true with `uid`.
bool controlledBy(const nlohmann::json& obj, const std::string& uid);
// An ownerReference to `owner` (kind, apiVersion), controller and blockOwnerDeletion.
nlohmann::json controllerRef(const nlohmann::json& owner, const std::string& apiVersion, const std::string& kind);

bool podReady(const nlohmann::json& pod);
bool podActive(const nlohmann::json& pod);  // not Succeeded/Failed, not being deleted

struct ReplicaSetPlan {
  int create = 0;                          // pods to create from the template
  std::vector<std::string> remove;         // pods to delete, in order
  nlohmann::json status;                   // the status to write
};
ReplicaSetPlan planReplicaSet(const nlohmann::json& rs, const std::vector<nlohmann::json>& pods);
// A pod of `rs`: its template with generateName `<rs>-`, the owner reference.
nlohmann::json podFromTemplate(const nlohmann::json& rs);

// The hash of a pod template: 10 lowercase letters/digits, as the
// pod-template-hash label and the ReplicaSet name suffix.
std::string podTemplateHash(const nlohmann::json& podTemplate);

struct DeploymentPlan {
  std::optional<nlohmann::json> create;   // a new ReplicaSet
  std::map<std::string, int> scale;       // ReplicaSet name -> spec.replicas
  std::vector<std::string> remove;        // old ReplicaSets beyond the history limit
  nlohmann::json status;
};
// `replicaSets`: those the Deployment controls; `pods`: the namespace's
// pods (Recreate waits until the old ReplicaSets' pods, terminating ones
// included, are gone). `now` for conditions and the progress deadline.
DeploymentPlan planDeployment(const nlohmann::json& deployment, const std::vector<nlohmann::json>& replicaSets,
                              const std::vector<nlohmann::json>& pods, WallTime now);

// The EndpointSlice of a Service with a selector (nullopt without one):
// named `<service>-<5 characters of a hash>`, labelled
// kubernetes.io/service-name, owned by the Service, one IPv4 endpoint per
// selected pod that has an IP (conditions ready, serving — the readiness —
// and terminating), the Service's ports with targetPort resolved (a number,
// or a container port's name on the pods).
std::optional<nlohmann::json> planEndpointSlice(const nlohmann::json& service, const std::vector<nlohmann::json>& pods);

}  // namespace tandem::kubelet
