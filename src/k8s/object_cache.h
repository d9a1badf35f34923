#pragma once
// The informer's local cache: objects by "namespace/name", with indexes by
// namespace and by label (key=value).
//
// replace() and apply() return the changes they made as Deltas, which is
// what the informer hands to event handlers. They compare resourceVersions,
// so a relist or a replayed watch event that brings nothing new produces no
// delta: handlers see each state once, whatever the connection did.
//
// Thread-safety: all methods may be called from any thread; readers get
// copies.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace tandem::k8s {

struct Delta {
  enum class Type { kAdded, kUpdated, kDeleted };
  Type type = Type::kAdded;
  nlohmann::json object;  // the new object; for kDeleted the last known state
  nlohmann::json old;     // kUpdated only: the previous state
};

class ObjectCache {
 public:
  // Replaces the whole content with a fresh list: objects not in `items` are
  // deleted, new ones added, ones whose resourceVersion changed updated.
  std::vector<Delta> replace(std::vector<nlohmann::json> items);
  // One watch event's effect. ADDED of a known object with a new
  // resourceVersion is an update; a repeat with the same resourceVersion,
  // or DELETED of an unknown object, changes nothing (nullopt).
  std::optional<Delta> upsert(nlohmann::json object);
  std::optional<Delta> erase(const nlohmann::json& object);

  std::optional<nlohmann::json> get(std::string_view ns, std::string_view name) const;
  std::optional<nlohmann::json> getByKey(std::string_view key) const;
  std::vector<nlohmann::json> list() const;
  std::vector<nlohmann::json> listInNamespace(std::string_view ns) const;
  // Objects whose metadata.labels[key] == value.
  std::vector<nlohmann::json> listByLabel(std::string_view key, std::string_view value) const;
  std::vector<std::string> keys() const;
  size_t size() const;

 private:
  void indexLocked(const std::string& key, const nlohmann::json& obj) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void unindexLocked(const std::string& key, const nlohmann::json& obj) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<nlohmann::json> collectLocked(const absl::flat_hash_set<std::string>* keys) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, nlohmann::json> objects_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>> byNamespace_ ABSL_GUARDED_BY(mu_);
  // "key=value" → object keys
  absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>> byLabel_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::k8s
