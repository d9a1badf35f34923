#include "e2e/apiserver/object_meta.h"

#include "e2e/apiserver/resource_types.h"

namespace tandem::apiserver {

using nlohmann::json;

const json& meta(const json& o) {
  static const json kEmpty = json::object();
  auto it = o.find("metadata");
  return it != o.end() && it->is_object() ? *it : kEmpty;
}

std::string nameOf(const json& o) { return meta(o).value("name", ""); }
std::string nsOf(const json& o) { return meta(o).value("namespace", ""); }
std::string uidOf(const json& o) { return meta(o).value("uid", ""); }
std::string resourceVersionOf(const json& o) { return meta(o).value("resourceVersion", ""); }

bool deleting(const json& o) {
  auto it = meta(o).find("deletionTimestamp");
  return it != meta(o).end() && !it->is_null();
}

std::vector<std::string> finalizersOf(const json& o) {
  std::vector<std::string> out;
  for (const auto& f : meta(o).value("finalizers", json::array())) {
    if (f.is_string()) out.push_back(f.get<std::string>());
  }
  return out;
}

void setFinalizers(json& o, const std::vector<std::string>& f) {
  if (f.empty()) {
    o["metadata"].erase("finalizers");
  } else {
    o["metadata"]["finalizers"] = f;
  }
}

json view(const ResourceType& t, json o) {
  o["apiVersion"] = t.apiVersion();
  o["kind"] = t.kind;
  return o;
}

}  // namespace tandem::apiserver
