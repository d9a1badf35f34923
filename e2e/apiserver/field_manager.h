#pragma once
// A simplified server-side apply: which manager owns which fields, apply
// with conflicts, and ownership moving on ordinary updates.
//
// Fields are leaf paths ("/spec/decode/replicas"); lists and scalars are
// leaves (every list is atomic: a real server merges lists declared
// listType=map/set element by element). Identity fields (apiVersion, kind,
// metadata.name/namespace/uid/...) are nobody's. Ownership is kept here,
// per object uid, and NOT written to metadata.managedFields (kubectl would
// otherwise try to migrate client-side-apply managers).
//
// Not thread-safe; the Router serialises calls.

#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace tandem::apiserver {

class FieldManager {
 public:
  // The object that applying `applied` as `manager` to `current` yields.
  // Throws ApiError 409 Conflict (causes: one per conflicting field) when
  // another manager owns a field whose value `applied` changes, unless
  // `force`, which takes the field over. Ownership is recorded only by
  // commit(); call it once the result was stored.
  struct ApplyResult {
    nlohmann::json object;
    std::set<std::string> fields;  // what `manager` owns after the apply
  };
  ApplyResult apply(const std::string& uid, const nlohmann::json& current, const nlohmann::json& applied,
                    const std::string& manager, bool force, const std::string& resource,
                    const std::string& group) const;
  void commitApply(const std::string& uid, const std::string& manager, std::set<std::string> fields);

  // An ordinary write (create, update, patch) by `manager`: it takes the
  // fields whose values changed from everyone else.
  void recordUpdate(const std::string& uid, const nlohmann::json& before, const nlohmann::json& after,
                    const std::string& manager);

  void forget(const std::string& uid) { owners_.erase(uid); }

 private:
  // uid -> manager -> owned leaf paths
  std::map<std::string, std::map<std::string, std::set<std::string>>> owners_;
};

}  // namespace tandem::apiserver
