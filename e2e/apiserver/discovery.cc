#include "e2e/apiserver/discovery.h"

#include <algorithm>
#include <ctime>
#include <map>
#include <set>

#include "e2e/apiserver/json_util.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

namespace {

const std::vector<std::string> kVerbs = {"create", "delete", "deletecollection", "get",
                                         "list",   "patch",  "update",           "watch"};

std::string gvPath(const ResourceType& t) {
  return t.group.empty() ? "api/v1" : strCat("apis/", t.group, "/", t.version);
}

// Versions of a group in the order they were defined (first = preferred).
std::vector<std::string> versionsOf(const std::vector<const ResourceType*>& types, const std::string& group) {
  std::vector<std::string> out;
  for (const auto* t : types) {
    if (t->group == group && std::find(out.begin(), out.end(), t->version) == out.end()) out.push_back(t->version);
  }
  return out;
}

json groupEntry(const std::vector<const ResourceType*>& types, const std::string& group) {
  json versions = json::array();
  for (const auto& v : versionsOf(types, group))
    versions.push_back({{"groupVersion", strCat(group, "/", v)}, {"version", v}});
  return {{"name", group}, {"versions", versions}, {"preferredVersion", versions[0]}};
}

// "5s", "3m", "2h", "4d": how a real server renders date columns (HumanDuration, simplified).
std::string humanAge(const std::string& rfc3339, WallTime now) {
  std::tm tm{};
  if (strptime(rfc3339.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return rfc3339;
  std::time_t then = timegm(&tm);
  long long secs = std::max<long long>(0, static_cast<long long>(std::chrono::system_clock::to_time_t(now) - then));
  if (secs < 120) return strCat(secs, "s");
  if (secs < 3 * 3600) return strCat(secs / 60, "m");
  if (secs < 2 * 86400) return strCat(secs / 3600, "h");
  return strCat(secs / 86400, "d");
}

}  // namespace

json apiVersionsDoc(const std::string& serverAddress) {
  return {{"kind", "APIVersions"},
          {"versions", {"v1"}},
          {"serverAddressByClientCIDRs", {{{"clientCIDR", "0.0.0.0/0"}, {"serverAddress", serverAddress}}}}};
}

json apiGroupListDoc(const std::vector<const ResourceType*>& types) {
  json groups = json::array();
  std::set<std::string> seen;
  for (const auto* t : types) {
    if (t->group.empty() || !seen.insert(t->group).second) continue;
    groups.push_back(groupEntry(types, t->group));
  }
  return {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", groups}};
}

json apiGroupDoc(const std::vector<const ResourceType*>& types, const std::string& group) {
  if (versionsOf(types, group).empty()) return nullptr;
  json g = groupEntry(types, group);
  g["kind"] = "APIGroup";
  g["apiVersion"] = "v1";
  return g;
}

json apiResourceListDoc(const std::vector<const ResourceType*>& types, const std::string& group,
                        const std::string& version) {
  json resources = json::array();
  bool any = false;
  for (const auto* t : types) {
    if (t->group != group || t->version != version) continue;
    any = true;
    json r = {{"name", t->plural},
              {"singularName", t->singular},
              {"namespaced", t->namespaced},
              {"kind", t->kind},
              {"verbs", kVerbs}};
    if (!t->shortNames.empty()) r["shortNames"] = t->shortNames;
    if (!t->categories.empty()) r["categories"] = t->categories;
    resources.push_back(r);
    if (t->hasStatus) {
      resources.push_back({{"name", t->plural + "/status"},
                           {"singularName", ""},
                           {"namespaced", t->namespaced},
                           {"kind", t->kind},
                           {"verbs", {"get", "patch", "update"}}});
    }
    if (t->podSubresources) {
      resources.push_back({{"name", t->plural + "/binding"},
                           {"singularName", ""},
                           {"namespaced", true},
                           {"kind", "Binding"},
                           {"verbs", {"create"}}});
      resources.push_back({{"name", t->plural + "/log"},
                           {"singularName", ""},
                           {"namespaced", true},
                           {"kind", "Pod"},
                           {"verbs", {"get"}}});
    }
    if (t->scale) {
      resources.push_back({{"name", t->plural + "/scale"},
                           {"singularName", ""},
                           {"namespaced", t->namespaced},
                           {"group", "autoscaling"},
                           {"version", "v1"},
                           {"kind", "Scale"},
                           {"verbs", {"get", "patch", "update"}}});
    }
  }
  if (!any) return nullptr;
  return {{"kind", "APIResourceList"},
          {"apiVersion", "v1"},
          {"groupVersion", group.empty() ? version : strCat(group, "/", version)},
          {"resources", resources}};
}

json openapiV3Index(const std::vector<const ResourceType*>& types) {
  json paths = json::object();
  for (const auto* t : types) {
    std::string p = gvPath(*t);
    // The hash only has to change when the document does; the count of kinds is enough here.
    size_t n = 0;
    for (const auto* u : types) n += gvPath(*u) == p ? 1 : 0;
    paths[p] = {{"serverRelativeURL", strCat("/openapi/v3/", p, "?hash=", n, t->plural)}};
  }
  return {{"paths", paths}};
}

json openapiV3Doc(const std::vector<const ResourceType*>& types, const std::string& path) {
  json paths = json::object();
  json schemas = json::object();
  for (const auto* t : types) {
    if (gvPath(*t) != path) continue;
    std::string base = strCat("/", path, t->namespaced ? "/namespaces/{namespace}/" : "/", t->plural, "/{name}");
    json gvk = {{"group", t->group}, {"version", t->version}, {"kind", t->kind}};
    json params = json::array({{{"name", "fieldValidation"}, {"in", "query"}, {"schema", {{"type", "string"}}}},
                               {{"name", "fieldManager"}, {"in", "query"}, {"schema", {{"type", "string"}}}}});
    json content = {{"application/json-patch+json", json::object()},
                    {"application/merge-patch+json", json::object()},
                    {"application/apply-patch+yaml", json::object()}};
    paths[base] = {{"patch",
                    {{"x-kubernetes-group-version-kind", gvk},
                     {"x-kubernetes-action", "patch"},
                     {"parameters", params},
                     {"requestBody", {{"content", content}}},
                     {"responses", {{"200", {{"description", "OK"}}}}}}}};
    std::string schemaName = strCat(t->group.empty() ? "io.k8s.api.core" : t->group, ".", t->version, ".", t->kind);
    json schema = t->schema ? *t->schema : json{{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}};
    schema["x-kubernetes-group-version-kind"] = json::array({gvk});
    schemas[schemaName] = schema;
  }
  if (paths.empty()) return nullptr;
  return {{"openapi", "3.0.0"},
          {"info", {{"title", "Tandem API-server emulator"}, {"version", "v1.32.0"}}},
          {"paths", paths},
          {"components", {{"schemas", schemas}}}};
}

json tableDoc(const ResourceType& type, const std::vector<json>& objects, const std::string& resourceVersion,
              const std::string& includeObject, bool withHeaders, WallTime now) {
  std::vector<PrinterColumn> columns = type.columns;
  if (columns.empty()) columns = {{"Age", "date", "", "", ".metadata.creationTimestamp"}};
  json defs = json::array();
  defs.push_back({{"name", "Name"},
                  {"type", "string"},
                  {"format", "name"},
                  {"description", "Name must be unique within a namespace."},
                  {"priority", 0}});
  for (const auto& c : columns) {
    defs.push_back({{"name", c.name},
                    {"type", c.type},
                    {"format", c.format},
                    {"description", c.description},
                    {"priority", c.priority}});
  }
  json rows = json::array();
  for (const auto& o : objects) {
    json cells = json::array({o["metadata"].value("name", "")});
    for (const auto& c : columns) {
      auto v = evalJsonPath(o, c.jsonPath);
      if (v && c.type == "date" && v->is_string()) v = humanAge(v->get<std::string>(), now);
      cells.push_back(v ? *v : json(nullptr));
    }
    json rowObject;
    if (includeObject == "Object") {
      rowObject = o;
    } else if (includeObject == "None") {
      rowObject = nullptr;
    } else {
      rowObject = {{"kind", "PartialObjectMetadata"}, {"apiVersion", "meta.k8s.io/v1"}, {"metadata", o["metadata"]}};
    }
    json row = {{"cells", cells}};
    if (!rowObject.is_null()) row["object"] = rowObject;
    rows.push_back(row);
  }
  json table = {{"kind", "Table"},
                {"apiVersion", "meta.k8s.io/v1"},
                {"metadata", {{"resourceVersion", resourceVersion}}},
                {"rows", rows}};
  table["columnDefinitions"] = withHeaders ? defs : json(nullptr);
  return table;
}

}  // namespace tandem::apiserver
