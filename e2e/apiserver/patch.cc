#include "e2e/apiserver/patch.h"

#include <string>
#include <vector>

#include "e2e/apiserver/api_error.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

json applyMergePatch(json target, const json& patch) {
  if (!patch.is_object()) throw badRequest("unable to apply patch: a merge patch must be a JSON object");
  target.merge_patch(patch);
  return target;
}

json applyJsonPatch(const json& target, const json& patch) {
  if (!patch.is_array()) {
    throw badRequest("json: cannot unmarshal object into Go value of type jsonpatch.Patch");
  }
  try {
    return target.patch(patch);
  } catch (const json::exception& e) {
    // NewGenericServerResponse(422, ...): reason Invalid, no details.
    throw ApiError(422, "Invalid", e.what());
  }
}

namespace {

const char* const kMergeKeys[] = {"name", "containerPort", "mountPath", "type", "ip", "devicePath"};

// The merge key every element of both lists has, or "" (the list replaces).
std::string mergeKeyFor(const json& a, const json& b) {
  for (const char* key : kMergeKeys) {
    bool all = true;
    for (const json* list : {&a, &b}) {
      for (const auto& item : *list) {
        if (!item.is_object() || !item.contains(key)) {
          // "$patch: delete" elements carry the key too; anything else disqualifies.
          all = false;
          break;
        }
      }
      if (!all) break;
    }
    if (all && !(a.empty() && b.empty())) return key;
  }
  return "";
}

json strategicMerge(json target, const json& patch);

json mergeLists(json target, const json& patch, const json* order) {
  std::string key = mergeKeyFor(target, patch);
  if (key.empty()) return patch;
  for (const auto& item : patch) {
    auto it = std::find_if(target.begin(), target.end(), [&](const json& t) { return t[key] == item[key]; });
    bool del = item.contains("$patch") && item["$patch"] == "delete";
    if (del) {
      if (it != target.end()) target.erase(it);
    } else if (it != target.end()) {
      *it = strategicMerge(*it, item);
    } else {
      json fresh = item;
      fresh.erase("$patch");
      target.push_back(fresh);
    }
  }
  if (order != nullptr && order->is_array()) {
    json ordered = json::array();
    for (const auto& o : *order) {
      for (const auto& t : target) {
        if (o.is_object() && o.contains(key) && t[key] == o[key]) ordered.push_back(t);
      }
    }
    for (const auto& t : target) {
      if (std::find(ordered.begin(), ordered.end(), t) == ordered.end()) ordered.push_back(t);
    }
    target = ordered;
  }
  return target;
}

json strategicMerge(json target, const json& patch) {
  if (!patch.is_object()) return patch;
  if (patch.contains("$patch")) {
    const json& directive = patch["$patch"];
    if (directive == "replace") {
      json out = patch;
      out.erase("$patch");
      return out;
    }
    if (directive == "delete") return nullptr;
    throw badRequest(strCat("unknown patch type: ", directive.dump()));
  }
  if (!target.is_object()) target = json::object();
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    const std::string& k = it.key();
    if (k.starts_with("$setElementOrder/") || k == "$retainKeys") continue;
    if (k.starts_with("$deleteFromPrimitiveList/")) {
      std::string field = k.substr(std::string("$deleteFromPrimitiveList/").size());
      if (target.contains(field) && target[field].is_array() && it->is_array()) {
        json kept = json::array();
        for (const auto& v : target[field]) {
          if (std::find(it->begin(), it->end(), v) == it->end()) kept.push_back(v);
        }
        target[field] = kept;
      }
      continue;
    }
    if (it->is_null()) {
      target.erase(k);
    } else if (it->is_object()) {
      json merged = strategicMerge(target.contains(k) ? target[k] : json(nullptr), *it);
      if (merged.is_null()) {
        target.erase(k);
      } else {
        target[k] = merged;
      }
    } else if (it->is_array() && target.contains(k) && target[k].is_array()) {
      std::string orderKey = strCat("$setElementOrder/", k);
      target[k] = mergeLists(target[k], *it, patch.contains(orderKey) ? &patch[orderKey] : nullptr);
    } else {
      target[k] = *it;
    }
  }
  if (patch.contains("$retainKeys") && patch["$retainKeys"].is_array()) {
    const json& keep = patch["$retainKeys"];
    for (auto it = target.begin(); it != target.end();) {
      if (std::find(keep.begin(), keep.end(), it.key()) == keep.end()) {
        it = target.erase(it);
      } else {
        ++it;
      }
    }
  }
  return target;
}

}  // namespace

json applyStrategicMergePatch(json target, const json& patch) {
  if (!patch.is_object()) throw badRequest("unable to apply patch: a strategic merge patch must be a JSON object");
  return strategicMerge(std::move(target), patch);
}

}  // namespace tandem::apiserver
