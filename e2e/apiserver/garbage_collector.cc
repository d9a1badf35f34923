#include "e2e/apiserver/garbage_collector.h"

#include <algorithm>

#include "e2e/apiserver/cluster.h"
#include "e2e/apiserver/object_meta.h"

namespace tandem::apiserver {

using nlohmann::json;

namespace {

constexpr const char* kForeground = "foregroundDeletion";
constexpr const char* kOrphan = "orphan";

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

std::vector<GcObject> gcSnapshot(const Cluster& cluster) {
  std::vector<GcObject> out;
  for (const auto& [key, o] : cluster.store.all()) {
    const ResourceType* t = cluster.types.byStorageKey(key);
    json refs = meta(*o).value("ownerReferences", json::array());
    out.push_back({.storageKey = key,
                   .ns = nsOf(*o),
                   .name = nameOf(*o),
                   .uid = uidOf(*o),
                   .namespaced = t != nullptr && t->namespaced,
                   .keptUntilEmpty = cluster.hooks.of(key).keptUntilEmpty,
                   .deleting = deleting(*o),
                   .finalizers = finalizersOf(*o),
                   .ownerReferences = refs.is_array() ? refs : json::array()});
  }
  return out;
}

GcPlanner::GcPlanner(std::vector<GcObject> objects) {
  nodes_.reserve(objects.size());
  for (auto& o : objects) {
    Node n{.obj = std::move(o)};
    for (const auto& ref : n.obj.ownerReferences) n.ownerUids.push_back(ref.value("uid", ""));
    nodes_.push_back(std::move(n));
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const GcObject& o = nodes_[i].obj;
    byUid_[o.uid] = i;
    for (const auto& owner : nodes_[i].ownerUids) dependents_[owner].push_back(i);
    if (o.namespaced && !o.ns.empty()) contents_[o.ns].push_back(i);
    if (o.keptUntilEmpty) namespaces_[o.name] = i;
  }
  queued_.assign(nodes_.size(), false);
}

bool GcPlanner::requestDeletion(const std::string& uid, DeletionPolicy policy) {
  auto it = byUid_.find(uid);
  if (it == byUid_.end() || nodes_[it->second].gone) return false;
  startDeletion(it->second, policy);
  return nodes_[it->second].gone;
}

void GcPlanner::collect() {
  for (size_t i = 0; i < nodes_.size(); ++i) enqueue(i);
  while (!queue_.empty()) {
    size_t i = queue_.front();
    queue_.pop_front();
    queued_[i] = false;
    examine(i);
  }
}

GcPlanner::Node* GcPlanner::find(const std::string& uid) {
  auto it = byUid_.find(uid);
  if (it == byUid_.end() || nodes_[it->second].gone) return nullptr;
  return &nodes_[it->second];
}

int GcPlanner::numReferrers(const std::string& uid) {
  int n = 0;
  for (size_t d : dependents_[uid]) {
    if (nodes_[d].gone) continue;
    for (const auto& ref : nodes_[d].obj.ownerReferences) {
      if (ref.value("uid", "") == uid) {
        ++n;
        break;
      }
    }
  }
  return n;
}

void GcPlanner::examine(size_t i) {
  if (nodes_[i].gone) return;
  if (!nodes_[i].obj.ownerReferences.empty()) {
    size_t before = actions_.size();
    examineOwnerRefs(i);
    if (actions_.size() != before) return;  // changed: examined again from the queue
  }
  if (!nodes_[i].obj.deleting) return;
  if (nodes_[i].obj.keptUntilEmpty) {
    examineNamespace(i);
  } else {
    examineDeleting(i);
  }
}

// A dependent: deleted when its owners are gone, released by orphaning
// owners, deleted in the foreground with a foreground-deleting owner.
void GcPlanner::examineOwnerRefs(size_t i) {
  const GcObject& o = nodes_[i].obj;
  json kept = json::array();
  bool anyOwner = false;
  bool foreground = false;
  for (const auto& ref : o.ownerReferences) {
    const Node* owner = find(ref.value("uid", ""));
    if (owner == nullptr) continue;
    anyOwner = true;
    const GcObject& w = owner->obj;
    if (w.deleting && has(w.finalizers, kOrphan)) continue;  // released
    kept.push_back(ref);
    foreground = foreground || (w.deleting && has(w.finalizers, kForeground));
  }
  if (kept.empty()) {
    if (anyOwner) {
      setOwnerRefs(i, json::array());  // every remaining owner orphans it
    } else if (!o.deleting) {
      startDeletion(i, DeletionPolicy::kBackground);
    }
  } else if (kept.size() != o.ownerReferences.size()) {
    setOwnerRefs(i, std::move(kept));
  } else if (foreground && !o.deleting) {
    startDeletion(i, DeletionPolicy::kForeground);
  }
}

// An owner waiting for its dependents (foreground) or for their release
// (orphan); or an object whose finalizers were all removed.
void GcPlanner::examineDeleting(size_t i) {
  std::vector<std::string> fs = nodes_[i].obj.finalizers;
  if (fs.empty()) {
    erase(i);
    return;
  }
  if (!has(fs, kForeground) && !has(fs, kOrphan)) return;
  if (numReferrers(nodes_[i].obj.uid) > 0) return;
  std::erase(fs, std::string(kForeground));
  std::erase(fs, std::string(kOrphan));
  if (fs.empty()) {
    erase(i);
  } else {
    setFinalizers(i, std::move(fs), GcActionType::kSetFinalizers);
  }
}

// A terminating namespace: delete what is in it; erase it once empty.
void GcPlanner::examineNamespace(size_t i) {
  bool empty = true;
  for (size_t m : contents_[nodes_[i].obj.name]) {
    if (nodes_[m].gone) continue;
    if (!nodes_[m].obj.deleting) startDeletion(m, DeletionPolicy::kBackground);
    empty = empty && nodes_[m].gone;
  }
  if (empty && nodes_[i].obj.finalizers.empty()) erase(i);
}

void GcPlanner::startDeletion(size_t i, DeletionPolicy policy) {
  GcObject& o = nodes_[i].obj;
  std::vector<std::string> fs = o.finalizers;
  auto add = [&fs](const char* f) {
    if (!has(fs, f)) fs.push_back(f);
  };
  if (!o.deleting && numReferrers(o.uid) > 0) {
    if (policy == DeletionPolicy::kForeground) add(kForeground);
    if (policy == DeletionPolicy::kOrphan) add(kOrphan);
  }
  if (fs.empty() && !o.keptUntilEmpty) {
    erase(i);
  } else if (!o.deleting || fs != o.finalizers) {
    o.deleting = true;
    setFinalizers(i, std::move(fs), GcActionType::kMarkDeleting);
  }
}

void GcPlanner::setOwnerRefs(size_t i, json refs) {
  nodes_[i].obj.ownerReferences = std::move(refs);
  record(i, GcActionType::kSetOwnerReferences);
  actions_.back().ownerReferences = nodes_[i].obj.ownerReferences;
}

void GcPlanner::setFinalizers(size_t i, std::vector<std::string> finalizers, GcActionType type) {
  nodes_[i].obj.finalizers = std::move(finalizers);
  record(i, type);
  actions_.back().finalizers = nodes_[i].obj.finalizers;
}

void GcPlanner::erase(size_t i) {
  nodes_[i].gone = true;
  record(i, GcActionType::kErase);
}

void GcPlanner::record(size_t i, GcActionType type) {
  const GcObject& o = nodes_[i].obj;
  actions_.push_back({.type = type, .storageKey = o.storageKey, .ns = o.ns, .name = o.name});
  touch(i);
}

void GcPlanner::touch(size_t i) {
  const GcObject& o = nodes_[i].obj;
  enqueue(i);
  for (const auto& owner : nodes_[i].ownerUids) {
    if (auto it = byUid_.find(owner); it != byUid_.end()) enqueue(it->second);
  }
  for (size_t d : dependents_[o.uid]) enqueue(d);
  if (o.namespaced) {
    if (auto it = namespaces_.find(o.ns); it != namespaces_.end()) enqueue(it->second);
  }
  if (o.keptUntilEmpty) {
    for (size_t m : contents_[o.name]) enqueue(m);
  }
}

void GcPlanner::enqueue(size_t i) {
  if (queued_[i] || nodes_[i].gone) return;
  queued_[i] = true;
  queue_.push_back(i);
}

}  // namespace tandem::apiserver
