#pragma once
// The emulator's object store: every object as JSON, one global
// resourceVersion counter, the history of changes that watches replay, and
// the watchers that receive new changes as they happen.
//
// resourceVersion: each write takes the next value of one counter; the
// object's metadata.resourceVersion and its event's rv are that value.
// History: the last `historyLimit` events; a watch that starts from an rv
// older than the oldest retained event gets 410 Expired (compactedRv).
//
// Not thread-safe: the Router serialises every call under its mutex, and
// watcher callbacks run under it too (they must only queue bytes).

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::apiserver {

enum class EventType { kAdded, kModified, kDeleted };
std::string eventTypeName(EventType type);

struct StoreEvent {
  uint64_t rv = 0;
  EventType type = EventType::kAdded;
  std::string storageKey;    // "apps/deployments"
  nlohmann::json object;     // the object after the change (before it, for kDeleted)
  nlohmann::json oldObject;  // before the change (null for kAdded)
};

class Store {
 public:
  using WatcherId = uint64_t;
  using Sink = std::function<void(const StoreEvent&)>;

  explicit Store(size_t historyLimit) : historyLimit_(historyLimit) {}

  uint64_t currentRv() const { return rv_; }
  // Events with rv <= compactedRv() are gone from the history.
  uint64_t compactedRv() const { return compactedRv_; }

  const nlohmann::json* get(const std::string& storageKey, const std::string& ns, const std::string& name) const;
  // All objects of a kind, in namespace `ns` ("" = every namespace), by namespace then name.
  std::vector<const nlohmann::json*> list(const std::string& storageKey, const std::string& ns) const;
  // Every object of every kind: storageKey -> objects (for GC).
  std::vector<std::pair<std::string, const nlohmann::json*>> all() const;

  // Writes `object` (ADDED if new, else MODIFIED): stamps the next
  // resourceVersion into it, records the event, notifies watchers; returns the stored object.
  nlohmann::json put(const std::string& storageKey, nlohmann::json object);
  // Removes the object (stamping the next resourceVersion into the DELETED event's object).
  void erase(const std::string& storageKey, const std::string& ns, const std::string& name);
  // Removes every object of a kind (a CRD went away), with DELETED events.
  void eraseAll(const std::string& storageKey);

  // Events of `storageKey` after `rv`, or nullopt if the history no longer
  // reaches back that far.
  std::optional<std::vector<const StoreEvent*>> eventsAfter(const std::string& storageKey, uint64_t rv) const;
  // Drops all history (tests use it to provoke 410 Expired).
  void compact();

  WatcherId addWatcher(const std::string& storageKey, Sink sink);
  void removeWatcher(WatcherId id);

 private:
  static std::string objectKey(const std::string& ns, const std::string& name) { return ns + "/" + name; }
  void record(StoreEvent event);

  const size_t historyLimit_;
  uint64_t rv_ = 1;
  uint64_t compactedRv_ = 0;
  std::map<std::string, std::map<std::string, nlohmann::json>> objects_;  // storageKey -> ns/name -> object
  std::deque<StoreEvent> history_;
  WatcherId nextWatcher_ = 1;
  struct Watcher {
    std::string storageKey;
    Sink sink;
  };
  std::map<WatcherId, Watcher> watchers_;
};

}  // namespace tandem::apiserver
