#pragma once
// The rules every write follows, whatever verb or patch type brought it:
// create (uid, timestamps, generation, name rules, namespace checks),
// update (resourceVersion checks, what a caller may not change, status vs.
// main endpoint, generation), validation (names, labels, the CRD schema,
// the type's hooks), deletion with finalizers and propagation, and the
// garbage collection that follows every change (garbage_collector.h).
//
// Errors are thrown as ApiError (api_error.h); the Router turns them into
// responses. Not thread-safe: runs under the Router's mutex.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e/apiserver/cluster.h"
#include "e2e/apiserver/garbage_collector.h"

namespace tandem::apiserver {

// Per-request state of a write: options from the query, and the Warning
// headers deep code adds.
struct Call {
  std::string manager = "unknown";       // ?fieldManager=
  std::string fieldValidation = "Warn";  // ?fieldValidation=Strict|Warn|Ignore
  std::vector<std::string> warnings;
};

// Throws 400 unless `obj` is an object of `t`'s apiVersion and kind
// (autoscaling/v1 Scale with `scale`).
void checkKind(const ResourceType& t, const nlohmann::json& obj, bool scale = false);

class ObjectWriter {
 public:
  explicit ObjectWriter(Cluster& cluster) : cluster_(cluster) {}

  // Stores a new object in namespace `ns` ("" for cluster-scoped kinds);
  // returns it as stored.
  nlohmann::json create(const ResourceType& t, const std::string& ns, nlohmann::json obj, Call& call);
  // Replaces `current` with `updated` through the main endpoint (sub "") or
  // /status. `requireRv`: a missing metadata.resourceVersion is 422 (PUT of a
  // custom resource). A write that changes nothing keeps the resourceVersion.
  nlohmann::json update(const ResourceType& t, const nlohmann::json& current, nlohmann::json updated,
                        const std::string& sub, bool requireRv, Call& call);
  // Deletes each of `objects` with `policy`, then collects garbage. True
  // when the first one was erased at once (no finalizers, not a namespace,
  // no grace period). `grace`: DeleteOptions.gracePeriodSeconds for them
  // (types with a gracePeriod hook; what the garbage collector deletes gets
  // the type's default).
  bool remove(const std::vector<nlohmann::json>& objects, DeletionPolicy policy,
              std::optional<int64_t> grace = std::nullopt);
  // Runs the garbage collector until the store holds no garbage.
  void collectGarbage();

 private:
  // `old`: the object before an update (CEL transition rules read it as oldSelf).
  void validate(const ResourceType& t, nlohmann::json& obj, Call& call, const nlohmann::json* old = nullptr);
  void checkCreatable(const ResourceType& t, const std::string& ns, const std::string& name);
  void defaults(const ResourceType& t, nlohmann::json& obj, const nlohmann::json* current);
  void stored(const ResourceType& t, const nlohmann::json& obj);
  // Applies a plan; true when a type's erased hook changed the store beyond it.
  bool apply(const std::vector<GcAction>& actions);
  bool erase(const std::string& storageKey, const nlohmann::json& obj);
  // Graceful deletion (TypeHooks::gracePeriod): true when `obj` is kept
  // (marked, or its grace shortened) instead of erased.
  bool keepForGrace(const std::string& storageKey, nlohmann::json& obj);

  Cluster& cluster_;
  // For the objects a remove() names: the grace period its caller asked for.
  std::map<std::string, int64_t> requestedGrace_;  // by uid
};

}  // namespace tandem::apiserver
