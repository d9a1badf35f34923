#include "e2e/apiserver/field_manager.h"

#include <vector>

#include "e2e/apiserver/api_error.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

namespace {

bool identityField(const std::string& path) {
  static const char* const kIdentity[] = {"/apiVersion",
                                          "/kind",
                                          "/metadata/name",
                                          "/metadata/namespace",
                                          "/metadata/uid",
                                          "/metadata/resourceVersion",
                                          "/metadata/generation",
                                          "/metadata/creationTimestamp",
                                          "/metadata/managedFields",
                                          "/metadata/deletionTimestamp",
                                          "/metadata/selfLink"};
  for (const char* p : kIdentity) {
    if (path == p) return true;
  }
  return false;
}

std::string escapeKey(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

void leaves(const json& value, const std::string& path, std::set<std::string>& out) {
  if (value.is_object() && !value.empty()) {
    for (auto it = value.begin(); it != value.end(); ++it)
      leaves(it.value(), strCat(path, "/", escapeKey(it.key())), out);
  } else if (!path.empty() && !identityField(path)) {
    out.insert(path);
  }
}

const json* at(const json& root, const std::string& path) {
  json::json_pointer p(path);
  return root.contains(p) ? &root.at(p) : nullptr;
}

void deepMerge(json& target, const json& applied) {
  if (!applied.is_object() || !target.is_object()) {
    target = applied;
    return;
  }
  for (auto it = applied.begin(); it != applied.end(); ++it) {
    if (it->is_object() && target.contains(it.key()) && target[it.key()].is_object()) {
      deepMerge(target[it.key()], *it);
    } else {
      target[it.key()] = *it;
    }
  }
}

std::string dotted(const std::string& pointer) {
  std::string out = pointer;
  for (auto& c : out) {
    if (c == '/') c = '.';
  }
  return out;
}

}  // namespace

FieldManager::ApplyResult FieldManager::apply(const std::string& uid, const json& current, const json& applied,
                                              const std::string& manager, bool force, const std::string& resource,
                                              const std::string& group) const {
  std::set<std::string> fields;
  leaves(applied, "", fields);
  static const std::map<std::string, std::set<std::string>> kNone;
  auto found = owners_.find(uid);
  const auto& owners = found == owners_.end() ? kNone : found->second;

  std::vector<StatusCause> conflicts;
  for (const std::string& f : fields) {
    const json* have = at(current, f);
    const json* want = at(applied, f);
    if (have == nullptr || (want != nullptr && *have == *want)) continue;
    for (const auto& [other, owned] : owners) {
      if (other != manager && owned.count(f) > 0) {
        conflicts.push_back({"FieldManagerConflict", strCat("conflict with \"", other, "\""), dotted(f)});
      }
    }
  }
  if (!conflicts.empty() && !force) {
    std::string msg =
        strCat("Apply failed with ", conflicts.size(), " conflict", conflicts.size() == 1 ? "" : "s", ": ");
    for (size_t i = 0; i < conflicts.size(); ++i) {
      msg += strCat(i > 0 ? "\n" : "", conflicts[i].message, ": ", conflicts[i].field);
    }
    ApiError e(409, "Conflict", msg);
    e.details = {{"name", current["metadata"].value("name", "")}, {"kind", resource}};
    if (!group.empty()) e.details["group"] = group;
    json causes = json::array();
    for (const auto& c : conflicts)
      causes.push_back({{"reason", c.reason}, {"message", c.message}, {"field", c.field}});
    e.details["causes"] = causes;
    throw e;
  }

  json result = current;
  auto mine = owners.find(manager);
  if (mine != owners.end()) {
    for (const std::string& f : mine->second) {
      if (fields.count(f) > 0) continue;
      bool shared = false;
      for (const auto& [other, owned] : owners) shared = shared || (other != manager && owned.count(f) > 0);
      json::json_pointer p(f);
      if (!shared && result.contains(p)) result.at(p.parent_pointer()).erase(p.back());
    }
  }
  deepMerge(result, applied);
  return {std::move(result), std::move(fields)};
}

void FieldManager::commitApply(const std::string& uid, const std::string& manager, std::set<std::string> fields) {
  auto& owners = owners_[uid];
  for (auto& [other, owned] : owners) {
    if (other == manager) continue;
    for (const auto& f : fields) owned.erase(f);  // force took them (or they were unowned by others)
  }
  owners[manager] = std::move(fields);
}

void FieldManager::recordUpdate(const std::string& uid, const json& before, const json& after,
                                const std::string& manager) {
  std::set<std::string> fields;
  leaves(after, "", fields);
  std::set<std::string> changed;
  for (const auto& f : fields) {
    const json* old = before.is_null() ? nullptr : at(before, f);
    if (old == nullptr || *old != *at(after, f)) changed.insert(f);
  }
  if (changed.empty()) return;
  auto& owners = owners_[uid];
  for (auto& [other, owned] : owners) {
    if (other == manager) continue;
    for (const auto& f : changed) owned.erase(f);
  }
  owners[manager].insert(changed.begin(), changed.end());
}

}  // namespace tandem::apiserver
