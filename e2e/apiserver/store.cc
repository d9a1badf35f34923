#include "e2e/apiserver/store.h"

#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

std::string eventTypeName(EventType type) {
  switch (type) {
    case EventType::kAdded:
      return "ADDED";
    case EventType::kModified:
      return "MODIFIED";
    case EventType::kDeleted:
      return "DELETED";
  }
  return "";
}

namespace {
std::string nsOf(const json& o) { return o["metadata"].value("namespace", ""); }
std::string nameOf(const json& o) { return o["metadata"].value("name", ""); }
}  // namespace

const json* Store::get(const std::string& storageKey, const std::string& ns, const std::string& name) const {
  auto kind = objects_.find(storageKey);
  if (kind == objects_.end()) return nullptr;
  auto it = kind->second.find(objectKey(ns, name));
  return it == kind->second.end() ? nullptr : &it->second;
}

std::vector<const json*> Store::list(const std::string& storageKey, const std::string& ns) const {
  std::vector<const json*> out;
  auto kind = objects_.find(storageKey);
  if (kind == objects_.end()) return out;
  for (const auto& [key, obj] : kind->second) {
    if (ns.empty() || nsOf(obj) == ns) out.push_back(&obj);
  }
  return out;
}

std::vector<std::pair<std::string, const json*>> Store::all() const {
  std::vector<std::pair<std::string, const json*>> out;
  for (const auto& [storageKey, objs] : objects_) {
    for (const auto& [key, obj] : objs) out.emplace_back(storageKey, &obj);
  }
  return out;
}

json Store::put(const std::string& storageKey, json object) {
  uint64_t rv = ++rv_;
  object["metadata"]["resourceVersion"] = std::to_string(rv);
  auto& slot = objects_[storageKey];
  std::string key = objectKey(nsOf(object), nameOf(object));
  auto it = slot.find(key);
  StoreEvent event{rv, it == slot.end() ? EventType::kAdded : EventType::kModified, storageKey, object,
                   it == slot.end() ? json(nullptr) : it->second};
  slot[key] = object;
  record(std::move(event));
  return object;
}

void Store::erase(const std::string& storageKey, const std::string& ns, const std::string& name) {
  auto kind = objects_.find(storageKey);
  if (kind == objects_.end()) return;
  auto it = kind->second.find(objectKey(ns, name));
  if (it == kind->second.end()) return;
  uint64_t rv = ++rv_;
  json object = std::move(it->second);
  kind->second.erase(it);
  json old = object;
  object["metadata"]["resourceVersion"] = std::to_string(rv);
  record(StoreEvent{rv, EventType::kDeleted, storageKey, std::move(object), std::move(old)});
}

void Store::eraseAll(const std::string& storageKey) {
  auto kind = objects_.find(storageKey);
  if (kind == objects_.end()) return;
  std::vector<std::pair<std::string, std::string>> keys;
  for (const auto& [key, obj] : kind->second) keys.emplace_back(nsOf(obj), nameOf(obj));
  for (const auto& [ns, name] : keys) erase(storageKey, ns, name);
}

void Store::record(StoreEvent event) {
  history_.push_back(std::move(event));
  while (history_.size() > historyLimit_) {
    compactedRv_ = history_.front().rv;
    history_.pop_front();
  }
  const StoreEvent& e = history_.back();
  // Copy the ids first: a sink may remove its own watcher.
  std::vector<WatcherId> ids;
  for (const auto& [id, w] : watchers_) {
    if (w.storageKey == e.storageKey) ids.push_back(id);
  }
  for (WatcherId id : ids) {
    auto it = watchers_.find(id);
    if (it != watchers_.end()) it->second.sink(e);
  }
}

std::optional<std::vector<const StoreEvent*>> Store::eventsAfter(const std::string& storageKey, uint64_t rv) const {
  if (rv < compactedRv_) return std::nullopt;
  std::vector<const StoreEvent*> out;
  for (const auto& e : history_) {
    if (e.rv > rv && e.storageKey == storageKey) out.push_back(&e);
  }
  return out;
}

void Store::compact() {
  if (!history_.empty()) compactedRv_ = history_.back().rv;
  compactedRv_ = rv_;
  history_.clear();
}

Store::WatcherId Store::addWatcher(const std::string& storageKey, Sink sink) {
  WatcherId id = nextWatcher_++;
  watchers_[id] = Watcher{storageKey, std::move(sink)};
  return id;
}

void Store::removeWatcher(WatcherId id) { watchers_.erase(id); }

}  // namespace tandem::apiserver
