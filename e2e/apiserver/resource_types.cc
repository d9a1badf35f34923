#include "e2e/apiserver/resource_types.h"

#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/schema.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

namespace {

ResourceType builtin(std::string group, std::string version, std::string kind, std::string plural, bool namespaced,
                     std::vector<std::string> shortNames = {}, std::vector<std::string> categories = {}) {
  ResourceType t;
  t.group = std::move(group);
  t.version = std::move(version);
  t.kind = kind;
  t.listKind = kind + "List";
  t.plural = std::move(plural);
  t.singular = kind;
  for (auto& c : t.singular) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  t.namespaced = namespaced;
  t.shortNames = std::move(shortNames);
  t.categories = std::move(categories);
  return t;
}

}  // namespace

std::vector<ResourceType> builtinResourceTypes() {
  std::vector<ResourceType> types;
  auto ns = builtin("", "v1", "Namespace", "namespaces", false, {"ns"});
  ns.hasStatus = true;
  ns.columns = {{"Status", "string", "", "The phase of the namespace", ".status.phase"},
                {"Age", "date", "", "", ".metadata.creationTimestamp"}};
  types.push_back(ns);
  auto node = builtin("", "v1", "Node", "nodes", false, {"no"});
  node.hasStatus = true;
  node.columns = {{"Ready", "string", "", "Whether the node's kubelet reports it ready",
                   ".status.conditions[?(@.type==\"Ready\")].status"},
                  {"Age", "date", "", "", ".metadata.creationTimestamp"},
                  {"Internal-IP", "string", "", "", ".status.addresses[?(@.type==\"InternalIP\")].address", 1}};
  types.push_back(node);
  auto pod = builtin("", "v1", "Pod", "pods", true, {"po"}, {"all"});
  pod.hasStatus = true;
  pod.podSubresources = true;
  pod.columns = {{"Status", "string", "", "The phase of the pod", ".status.phase"},
                 {"Restarts", "integer", "", "The first container's restarts", ".status.containerStatuses[0].restartCount"},
                 {"Age", "date", "", "", ".metadata.creationTimestamp"},
                 {"IP", "string", "", "", ".status.podIP", 1},
                 {"Node", "string", "", "", ".spec.nodeName", 1}};
  types.push_back(pod);
  auto svc = builtin("", "v1", "Service", "services", true, {"svc"}, {"all"});
  svc.hasStatus = true;
  svc.columns = {{"Type", "string", "", "", ".spec.type"},
                 {"Cluster-IP", "string", "", "", ".spec.clusterIP"},
                 {"Age", "date", "", "", ".metadata.creationTimestamp"}};
  types.push_back(svc);
  types.push_back(builtin("", "v1", "ConfigMap", "configmaps", true, {"cm"}));
  types.push_back(builtin("", "v1", "Secret", "secrets", true));
  types.push_back(builtin("", "v1", "ServiceAccount", "serviceaccounts", true, {"sa"}));
  auto coreEvent = builtin("", "v1", "Event", "events", true, {"ev"});
  coreEvent.columns = {{"Last Seen", "date", "", "", ".lastTimestamp"},
                       {"Type", "string", "", "", ".type"},
                       {"Reason", "string", "", "", ".reason"},
                       {"Object", "string", "", "", ".involvedObject.name"},
                       {"Message", "string", "", "", ".message"}};
  types.push_back(coreEvent);
  auto deploy = builtin("apps", "v1", "Deployment", "deployments", true, {"deploy"}, {"all"});
  deploy.hasStatus = true;
  deploy.hasGeneration = true;
  deploy.scale = ScalePaths{".spec.replicas", ".status.replicas", ".spec.selector"};
  deploy.columns = {{"Replicas", "integer", "", "", ".spec.replicas"},
                    {"Ready", "integer", "", "", ".status.readyReplicas"},
                    {"Up-to-date", "integer", "", "", ".status.updatedReplicas"},
                    {"Available", "integer", "", "", ".status.availableReplicas"},
                    {"Age", "date", "", "", ".metadata.creationTimestamp"}};
  types.push_back(deploy);
  auto rs = builtin("apps", "v1", "ReplicaSet", "replicasets", true, {"rs"}, {"all"});
  rs.hasStatus = true;
  rs.hasGeneration = true;
  rs.scale = ScalePaths{".spec.replicas", ".status.replicas", ".spec.selector"};
  rs.columns = {{"Desired", "integer", "", "", ".spec.replicas"},
                {"Current", "integer", "", "", ".status.replicas"},
                {"Ready", "integer", "", "", ".status.readyReplicas"},
                {"Age", "date", "", "", ".metadata.creationTimestamp"}};
  types.push_back(rs);
  types.push_back(builtin("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", true));
  types.push_back(builtin("coordination.k8s.io", "v1", "Lease", "leases", true));
  // RBAC objects are stored (the operator and the chart create them); nothing enforces them yet.
  types.push_back(builtin("rbac.authorization.k8s.io", "v1", "Role", "roles", true));
  types.push_back(builtin("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", true));
  types.push_back(builtin("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", false));
  types.push_back(builtin("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", false));
  auto event = builtin("events.k8s.io", "v1", "Event", "events", true, {"ev"});
  event.columns = {{"Type", "string", "", "", ".type"},
                   {"Reason", "string", "", "", ".reason"},
                   {"Object", "string", "", "", ".regarding.name"},
                   {"Note", "string", "", "", ".note"},
                   {"Age", "date", "", "", ".metadata.creationTimestamp"}};
  types.push_back(event);
  auto crd = builtin("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", false,
                     {"crd", "crds"}, {"api-extensions"});
  crd.hasStatus = true;
  crd.hasGeneration = true;
  crd.columns = {{"Created At", "date", "", "", ".metadata.creationTimestamp"}};
  types.push_back(crd);
  for (auto& t : types) {
    if (t.kind == "Event") t.singular = "event";
    if (t.plural == "customresourcedefinitions") t.singular = "customresourcedefinition";
    if (t.plural == "endpointslices") t.singular = "endpointslice";
  }
  return types;
}

std::vector<ResourceType> typesFromCrd(const json& crd) {
  std::vector<StatusCause> causes;
  const std::string name = crd.value("/metadata/name"_json_pointer, "");
  const json spec = crd.value("spec", json::object());
  const std::string group = spec.value("group", "");
  const json names = spec.value("names", json::object());
  const std::string plural = names.value("plural", "");
  const std::string kind = names.value("kind", "");
  const std::string scope = spec.value("scope", "");
  if (group.empty()) causes.push_back(fieldRequired("spec.group"));
  if (plural.empty()) causes.push_back(fieldRequired("spec.names.plural"));
  if (kind.empty()) causes.push_back(fieldRequired("spec.names.kind"));
  if (scope != "Namespaced" && scope != "Cluster") {
    causes.push_back(fieldNotSupported("spec.scope", scope, {"Cluster", "Namespaced"}));
  }
  if (!plural.empty() && !group.empty() && name != strCat(plural, ".", group)) {
    causes.push_back(fieldInvalid("metadata.name", name, "must be spec.names.plural+\".\"+spec.group"));
  }
  const json versions = spec.value("versions", json::array());
  if (!versions.is_array() || versions.empty())
    causes.push_back(
        fieldInvalid("spec.versions", versions, "must have exactly one version marked as storage version"));
  int numStorage = 0;
  for (size_t i = 0; versions.is_array() && i < versions.size(); ++i) {
    const json& v = versions[i];
    if (v.value("storage", false)) ++numStorage;
    if (!v.contains("schema") || !v["schema"].contains("openAPIV3Schema")) {
      causes.push_back(fieldRequired(strCat("spec.versions[", i, "].schema.openAPIV3Schema"), "schemas are required"));
    } else {
      // A rule outside the CEL subset here is refused, as a real server refuses one that does not compile.
      for (StatusCause& c : compileValidationRules(v["schema"]["openAPIV3Schema"],
                                                   strCat("spec.versions[", i, "].schema.openAPIV3Schema"))) {
        causes.push_back(std::move(c));
      }
    }
  }
  if (versions.is_array() && !versions.empty() && numStorage != 1) {
    causes.push_back(
        fieldInvalid("spec.versions", versions, "must have exactly one version marked as storage version"));
  }
  if (!causes.empty()) throw invalid("CustomResourceDefinition", "apiextensions.k8s.io", name, causes);

  std::vector<ResourceType> types;
  for (const auto& v : versions) {
    if (!v.value("served", true)) continue;
    ResourceType t;
    t.group = group;
    t.version = v.value("name", "");
    t.kind = kind;
    t.listKind = names.value("listKind", kind + "List");
    t.plural = plural;
    t.singular = names.value("singular", "");
    if (t.singular.empty()) {
      t.singular = kind;
      for (auto& c : t.singular) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    t.namespaced = scope == "Namespaced";
    t.shortNames = names.value("shortNames", std::vector<std::string>{});
    t.categories = names.value("categories", std::vector<std::string>{});
    t.custom = true;
    t.hasGeneration = true;
    const json sub = v.value("subresources", json::object());
    t.hasStatus = sub.contains("status");
    if (sub.contains("scale")) {
      const json& s = sub["scale"];
      t.scale = ScalePaths{s.value("specReplicasPath", ".spec.replicas"),
                           s.value("statusReplicasPath", ".status.replicas"), s.value("labelSelectorPath", "")};
    }
    for (const auto& c : v.value("additionalPrinterColumns", json::array())) {
      t.columns.push_back({c.value("name", ""), c.value("type", "string"), c.value("format", ""),
                           c.value("description", ""), c.value("jsonPath", ""), c.value("priority", 0)});
    }
    if (t.columns.empty()) t.columns = {{"Age", "date", "", "", ".metadata.creationTimestamp"}};
    t.schema = v["schema"]["openAPIV3Schema"];
    types.push_back(std::move(t));
  }
  return types;
}

std::vector<const ResourceType*> TypeRegistry::all() const {
  std::vector<const ResourceType*> out;
  for (const auto& t : builtins_) out.push_back(&t);
  for (const auto& [name, ts] : crds_) {
    for (const auto& t : ts) out.push_back(&t);
  }
  return out;
}

const ResourceType* TypeRegistry::find(const std::string& group, const std::string& version,
                                       const std::string& plural) const {
  for (const auto* t : all()) {
    if (t->group == group && t->version == version && t->plural == plural) return t;
  }
  return nullptr;
}

const ResourceType* TypeRegistry::byStorageKey(const std::string& storageKey) const {
  for (const auto* t : all()) {
    if (t->storageKey() == storageKey) return t;
  }
  return nullptr;
}

const ResourceType& TypeRegistry::builtin(const std::string& group, const std::string& plural) const {
  for (const auto& t : builtins_) {
    if (t.plural == plural && t.group == group) return t;
  }
  std::abort();
}

void TypeRegistry::setCrd(const std::string& crdName, std::vector<ResourceType> types) {
  crds_[crdName] = std::move(types);
}

std::string TypeRegistry::eraseCrd(const std::string& crdName) {
  auto it = crds_.find(crdName);
  if (it == crds_.end()) return "";
  std::string key = it->second.empty() ? "" : it->second.front().storageKey();
  crds_.erase(it);
  return key;
}

}  // namespace tandem::apiserver
