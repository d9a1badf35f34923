#pragma once
// Per-resource-type behaviour, registered per type (by storage key) instead
// of checks of a type's name spread over the writes and the collector: the
// defaults a server sets, the type's own validation, what it keeps in step
// when one of its objects is stored or erased, and how deleting one proceeds.
// A type without an entry gets TypeHooks{} (nothing extra).
//
// The built-in entries (what a real server's registry strategies do for these kinds):
//   namespaces        name an RFC 1123 label; spec.finalizers ["kubernetes"]; status.phase Active on create;
//                     deleting keeps it (phase Terminating) until the collector has emptied it;
//                     a live namespace always has a ServiceAccount "default" (kube-controller-manager's)
//   serviceaccounts   "default" is made again when deleted from a live namespace
//   services          name an RFC 1123 label; spec.type ClusterIP; a fake spec.clusterIP, kept by updates
//   secrets           stringData folded into base64 data; type Opaque
//   pods              restartPolicy Always, terminationGracePeriodSeconds 30, dnsPolicy, schedulerName;
//                     status.phase Pending on create; a pod bound to a node is deleted gracefully
//                     (kept, deletionTimestamp = now + grace, until its kubelet deletes it with grace 0)
//   deployments       spec.replicas 1; strategy RollingUpdate 25%/25%; revisionHistoryLimit 10;
//                     progressDeadlineSeconds 600
//   replicasets       spec.replicas 1
//   events.k8s.io events  mirrored as core/v1 Events of the same name (what kubectl reads)
//   customresourcedefinitions  names completed (singular, listKind); status NamesAccepted and Established;
//                     validated as a CRD; storing one serves its types, erasing one stops serving them
//                     and erases their objects
//
// defaults and validate are pure over their arguments; stored and erased
// change the Cluster they are given. All run under the emulator's mutex.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "e2e/apiserver/resource_types.h"
#include "src/common/clock.h"

namespace tandem::apiserver {

struct Cluster;

// What defaults may depend on besides the object.
struct DefaultsContext {
  const nlohmann::json* current = nullptr;  // the stored object on an update; null on create
  uint64_t currentRv = 0;                   // the store's resourceVersion before this write
  WallTime now;
};

enum class NameRule {
  kDnsSubdomain,  // lowercase RFC 1123 subdomain, up to 253 characters (most kinds)
  kDnsLabel,      // lowercase RFC 1123 label, up to 63 characters
};

struct TypeHooks {
  NameRule nameRule = NameRule::kDnsSubdomain;
  // Create adds an empty spec when the object has none (the defaults write into it).
  bool specOnCreate = false;
  // Deleting marks the object (status.phase Terminating) and keeps it until
  // the garbage collector has deleted everything in it (a namespace).
  bool keptUntilEmpty = false;
  // Server-set fields, on create and on every update.
  std::function<void(nlohmann::json& obj, const DefaultsContext& ctx)> defaults;
  // The type's own rules, checked once the generic ones passed; throws ApiError.
  std::function<void(const nlohmann::json& obj)> validate;
  // After an object of the type was stored / erased.
  std::function<void(const nlohmann::json& obj, Cluster& cluster)> stored;
  std::function<void(const nlohmann::json& obj, Cluster& cluster)> erased;
  // Graceful deletion: the grace period (seconds) a delete without one gives
  // `obj`, or nullopt when it is erased at once. While the grace runs the
  // object is kept (deletionTimestamp set to its end), until a delete with
  // grace 0 (the kubelet's, once the pod's containers stopped).
  std::function<std::optional<int64_t>(const nlohmann::json& obj)> gracePeriod;
};

class TypeHookRegistry {
 public:
  // The entries listed at the top.
  static TypeHookRegistry builtins();

  void add(const std::string& storageKey, TypeHooks hooks) { byStorageKey_[storageKey] = std::move(hooks); }
  // The type's hooks; TypeHooks{} when none are registered.
  const TypeHooks& of(const ResourceType& type) const { return of(type.storageKey()); }
  const TypeHooks& of(const std::string& storageKey) const;

 private:
  std::map<std::string, TypeHooks> byStorageKey_;
  TypeHooks none_;
};

}  // namespace tandem::apiserver
