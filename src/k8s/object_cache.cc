#include "src/k8s/object_cache.h"

#include <algorithm>

#include "src/common/strings.h"
#include "src/k8s/resource.h"

namespace tandem::k8s {

namespace {
std::string labelIndexKey(std::string_view key, std::string_view value) { return strCat(key, "=", value); }
}  // namespace

void ObjectCache::indexLocked(const std::string& key, const nlohmann::json& obj) {
  byNamespace_[objectNamespace(obj)].insert(key);
  for (const auto& [k, v] : objectLabels(obj).items()) {
    if (v.is_string()) byLabel_[labelIndexKey(k, v.get<std::string>())].insert(key);
  }
}

void ObjectCache::unindexLocked(const std::string& key, const nlohmann::json& obj) {
  auto eraseFrom = [&](auto& index, const std::string& indexKey) {
    auto it = index.find(indexKey);
    if (it == index.end()) return;
    it->second.erase(key);
    if (it->second.empty()) index.erase(it);
  };
  eraseFrom(byNamespace_, objectNamespace(obj));
  for (const auto& [k, v] : objectLabels(obj).items()) {
    if (v.is_string()) eraseFrom(byLabel_, labelIndexKey(k, v.get<std::string>()));
  }
}

std::vector<Delta> ObjectCache::replace(std::vector<nlohmann::json> items) {
  absl::MutexLock lock(&mu_);
  std::vector<Delta> deltas;
  absl::flat_hash_set<std::string> seen;
  for (nlohmann::json& obj : items) {
    std::string key = objectKey(obj);
    seen.insert(key);
    auto it = objects_.find(key);
    if (it == objects_.end()) {
      indexLocked(key, obj);
      objects_.emplace(key, obj);
      deltas.push_back({Delta::Type::kAdded, std::move(obj), nullptr});
      continue;
    }
    if (objectResourceVersion(it->second) == objectResourceVersion(obj)) continue;
    unindexLocked(key, it->second);
    indexLocked(key, obj);
    nlohmann::json old = std::exchange(it->second, obj);
    deltas.push_back({Delta::Type::kUpdated, std::move(obj), std::move(old)});
  }
  std::vector<std::string> gone;
  for (const auto& [key, obj] : objects_) {
    if (!seen.contains(key)) gone.push_back(key);
  }
  std::sort(gone.begin(), gone.end());
  for (const std::string& key : gone) {
    auto it = objects_.find(key);
    unindexLocked(key, it->second);
    deltas.push_back({Delta::Type::kDeleted, std::move(it->second), nullptr});
    objects_.erase(it);
  }
  return deltas;
}

std::optional<Delta> ObjectCache::upsert(nlohmann::json object) {
  absl::MutexLock lock(&mu_);
  std::string key = objectKey(object);
  auto it = objects_.find(key);
  if (it == objects_.end()) {
    indexLocked(key, object);
    objects_.emplace(key, object);
    return Delta{Delta::Type::kAdded, std::move(object), nullptr};
  }
  if (objectResourceVersion(it->second) == objectResourceVersion(object)) return std::nullopt;
  unindexLocked(key, it->second);
  indexLocked(key, object);
  nlohmann::json old = std::exchange(it->second, object);
  return Delta{Delta::Type::kUpdated, std::move(object), std::move(old)};
}

std::optional<Delta> ObjectCache::erase(const nlohmann::json& object) {
  absl::MutexLock lock(&mu_);
  std::string key = objectKey(object);
  auto it = objects_.find(key);
  if (it == objects_.end()) return std::nullopt;
  unindexLocked(key, it->second);
  objects_.erase(it);
  // The event's object is the final state (it may carry a newer RV).
  return Delta{Delta::Type::kDeleted, object, nullptr};
}

std::optional<nlohmann::json> ObjectCache::get(std::string_view ns, std::string_view name) const {
  return getByKey(objectKey(ns, name));
}

std::optional<nlohmann::json> ObjectCache::getByKey(std::string_view key) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = objects_.find(std::string(key));
  if (it == objects_.end()) return std::nullopt;
  return it->second;
}

std::vector<nlohmann::json> ObjectCache::collectLocked(const absl::flat_hash_set<std::string>* keys) const {
  std::vector<std::pair<std::string, const nlohmann::json*>> found;
  if (keys == nullptr) {
    for (const auto& [key, obj] : objects_) found.emplace_back(key, &obj);
  } else {
    for (const std::string& key : *keys) found.emplace_back(key, &objects_.at(key));
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<nlohmann::json> out;
  out.reserve(found.size());
  for (const auto& [key, obj] : found) out.push_back(*obj);
  return out;
}

std::vector<nlohmann::json> ObjectCache::list() const {
  absl::ReaderMutexLock lock(&mu_);
  return collectLocked(nullptr);
}

std::vector<nlohmann::json> ObjectCache::listInNamespace(std::string_view ns) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = byNamespace_.find(std::string(ns));
  if (it == byNamespace_.end()) return {};
  return collectLocked(&it->second);
}

std::vector<nlohmann::json> ObjectCache::listByLabel(std::string_view key, std::string_view value) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = byLabel_.find(labelIndexKey(key, value));
  if (it == byLabel_.end()) return {};
  return collectLocked(&it->second);
}

std::vector<std::string> ObjectCache::keys() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [key, obj] : objects_) out.push_back(key);
  std::sort(out.begin(), out.end());
  return out;
}

size_t ObjectCache::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return objects_.size();
}

}  // namespace tandem::k8s
