#pragma once
// Garbage collection of dependents and the deletion rules, as one pass over
// a snapshot of the store that computes what to change; the caller then
// applies the actions to the store in order. Pure code: no store, no HTTP.
//
//   GcPlanner plan(gcSnapshot(cluster));
//   bool gone = plan.requestDeletion(uid, DeletionPolicy::kForeground);  // a DELETE (optional)
//   plan.collect();
//   for (const GcAction& a : plan.actions()) apply(a);
//
// Rules (a real cluster's GC controller and namespace controller, run to
// completion at once instead of in the background):
//  - Deleting an object with finalizers marks it (deletionTimestamp) and keeps
//    it until they are gone; without finalizers it is erased. Foreground and
//    Orphan deletion of an object that has dependents add the finalizer
//    foregroundDeletion / orphan first.
//  - A dependent whose owners (ownerReferences) are all gone is deleted
//    (Background). An owner being deleted with `orphan` releases its
//    dependents: the reference to it is dropped (all references, when no
//    other owner remains), and then the `orphan` finalizer.
//  - Dependents of an owner being deleted with `foregroundDeletion` are
//    deleted (Foreground); the owner's finalizer goes once no dependent
//    refers to it any more.
//  - A deleting object whose finalizers were all removed is erased.
//  - A namespace being deleted has everything in it deleted, and is erased
//    once it is empty and has no finalizers of its own.
// Every change only removes (objects, references, finalizers) or marks
// objects deleting, so the pass ends; each object is re-examined only when a
// neighbour (owner, dependent, namespace) changed.

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::apiserver {

struct Cluster;

enum class DeletionPolicy { kBackground, kForeground, kOrphan };

// What the collector reads of one object.
struct GcObject {
  std::string storageKey;
  std::string ns;
  std::string name;
  std::string uid;
  bool namespaced = false;      // of a namespaced kind: part of its namespace's contents
  bool keptUntilEmpty = false;  // a namespace
  bool deleting = false;
  std::vector<std::string> finalizers;
  nlohmann::json ownerReferences = nlohmann::json::array();
};

enum class GcActionType {
  kSetOwnerReferences,  // write `ownerReferences` (empty: remove the field)
  kMarkDeleting,        // set deletionTimestamp (if unset) and `finalizers`
  kSetFinalizers,       // an object already deleting: write `finalizers`
  kErase,               // remove the object
};

struct GcAction {
  GcActionType type;
  std::string storageKey;
  std::string ns;
  std::string name;
  nlohmann::json ownerReferences;       // kSetOwnerReferences
  std::vector<std::string> finalizers;  // kMarkDeleting, kSetFinalizers
};

// Every object of the cluster, as the collector reads it.
std::vector<GcObject> gcSnapshot(const Cluster& cluster);

class GcPlanner {
 public:
  explicit GcPlanner(std::vector<GcObject> objects);

  // Starts deleting the object with `uid` as a DELETE with `policy` does.
  // True when it was erased at once (nothing to wait for); false when it
  // waits (finalizers, a namespace's contents) or does not exist.
  bool requestDeletion(const std::string& uid, DeletionPolicy policy);
  // Runs the rules above until nothing changes.
  void collect();
  // What to do to the store, in order.
  const std::vector<GcAction>& actions() const { return actions_; }

 private:
  struct Node {
    GcObject obj;
    std::vector<std::string> ownerUids;  // as first seen: whom to tell when this changes
    bool gone = false;
  };

  Node* find(const std::string& uid);
  // Live objects that still name `uid` as an owner.
  int numReferrers(const std::string& uid);
  void examine(size_t i);
  void examineOwnerRefs(size_t i);
  void examineDeleting(size_t i);
  void examineNamespace(size_t i);

  void startDeletion(size_t i, DeletionPolicy policy);
  void setOwnerRefs(size_t i, nlohmann::json refs);
  void setFinalizers(size_t i, std::vector<std::string> finalizers, GcActionType type);
  void erase(size_t i);
  void record(size_t i, GcActionType type);
  // Queues `i` and everything whose rules may read it.
  void touch(size_t i);
  void enqueue(size_t i);

  std::vector<Node> nodes_;
  std::map<std::string, size_t> byUid_;
  std::map<std::string, std::vector<size_t>> dependents_;  // owner uid -> nodes that named it
  std::map<std::string, std::vector<size_t>> contents_;    // namespace -> namespaced nodes in it
  std::map<std::string, size_t> namespaces_;               // namespace name -> its node
  std::deque<size_t> queue_;
  std::vector<bool> queued_;
  std::vector<GcAction> actions_;
};

}  // namespace tandem::apiserver
