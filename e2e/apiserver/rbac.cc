#include "e2e/apiserver/rbac.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "e2e/apiserver/json_util.h"
#include "e2e/apiserver/object_meta.h"
#include "e2e/apiserver/patch.h"
#include "e2e/apiserver/requests.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

namespace {

constexpr const char* kRbacGroup = "rbac.authorization.k8s.io";
const std::string kRoles = "rbac.authorization.k8s.io/roles";
const std::string kClusterRoles = "rbac.authorization.k8s.io/clusterroles";
const std::string kRoleBindings = "rbac.authorization.k8s.io/rolebindings";
const std::string kClusterRoleBindings = "rbac.authorization.k8s.io/clusterrolebindings";

// What Kubernetes' default ClusterRoles system:discovery, system:public-info-viewer
// and system:basic-user grant, bound to system:authenticated (bootstrappolicy).
const json& authenticatedRules() {
  static const json kRules = json::parse(R"([
    {"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                                           "/openapi/*", "/readyz", "/version", "/version/"]},
    {"verbs": ["create"], "apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"]},
    {"verbs": ["create"], "apiGroups": ["authorization.k8s.io"],
     "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]}
  ])");
  return kRules;
}

std::vector<std::string> splitPath(const std::string& path) {
  return absl::StrSplit(path, '/', absl::SkipEmpty());
}

std::vector<std::string> strings(const json& rule, const char* key) {
  std::vector<std::string> out;
  auto it = rule.find(key);
  if (it == rule.end() || !it->is_array()) return out;
  for (const json& v : *it) {
    if (v.is_string()) out.push_back(v.get<std::string>());
  }
  return out;
}

bool has(const std::vector<std::string>& values, const std::string& v) {
  return std::find(values.begin(), values.end(), v) != values.end();
}
bool hasOrAll(const std::vector<std::string>& values, const std::string& v) { return has(values, "*") || has(values, v); }

std::string str(const json& j, const char* key) {
  auto it = j.is_object() ? j.find(key) : j.end();
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// The name a list or watch is pinned to by fieldSelector=metadata.name=<n> (or ==).
std::string pinnedName(const http::Request& req) {
  std::optional<std::string> selector = req.query("fieldSelector");
  if (!selector) return "";
  for (const std::string& term : std::vector<std::string>(absl::StrSplit(*selector, ','))) {
    for (const std::string op : {"==", "="}) {
      if (term.starts_with("metadata.name" + op)) return term.substr(std::string("metadata.name").size() + op.size());
    }
  }
  return "";
}

bool appliesTo(const UserInfo& user, const json& subjects, const std::string& bindingNs) {
  if (!subjects.is_array()) return false;
  for (const json& s : subjects) {
    const std::string kind = str(s, "kind"), name = str(s, "name");
    if (kind == "User" && name == user.name) return true;
    if (kind == "Group" && user.inGroup(name)) return true;
    if (kind == "ServiceAccount") {
      // A RoleBinding's ServiceAccount subject without a namespace is of the binding's.
      const std::string ns = str(s, "namespace").empty() ? bindingNs : str(s, "namespace");
      if (!ns.empty() && user.name == strCat("system:serviceaccount:", ns, ":", name)) return true;
    }
  }
  return false;
}

std::string describeSubject(const UserInfo& user, const json& subjects, const std::string& bindingNs) {
  for (const json& s : subjects) {
    if (appliesTo(user, json::array({s}), bindingNs)) {
      const std::string kind = str(s, "kind");
      if (kind == "ServiceAccount") {
        return strCat("ServiceAccount \"", str(s, "name"), "/", str(s, "namespace").empty() ? bindingNs : str(s, "namespace"), "\"");
      }
      return strCat(kind, " \"", str(s, "name"), "\"");
    }
  }
  return "";
}

// The rules of a binding's roleRef; an error message when the role is missing.
struct RoleRules {
  const json* rules = nullptr;
  std::string error;
};

RoleRules roleRefRules(const Store& store, const json& roleRef, const std::string& bindingNs) {
  const std::string kind = str(roleRef, "kind"), name = str(roleRef, "name");
  const json* role = nullptr;
  if (kind == "Role" && !bindingNs.empty()) {
    role = store.get(kRoles, bindingNs, name);
    if (role == nullptr) return {nullptr, strCat("role.rbac.authorization.k8s.io \"", name, "\" not found")};
  } else if (kind == "ClusterRole") {
    role = store.get(kClusterRoles, "", name);
    if (role == nullptr) return {nullptr, strCat("clusterrole.rbac.authorization.k8s.io \"", name, "\" not found")};
  } else {
    return {nullptr, strCat("unsupported role reference kind: \"", kind, "\"")};
  }
  static const json kNone = json::array();
  auto it = role->find("rules");
  return {it != role->end() && it->is_array() ? &*it : &kNone, ""};
}

// Every rule that applies to `user` in `ns` ("" = cluster-wide only), with
// where it came from; `visit` returns true to stop.
struct RuleSource {
  std::string bindingKind, bindingName, roleKind, roleName, subject;
};
void visitRules(const Store& store, const UserInfo& user, const std::string& ns, std::vector<std::string>& errors,
                const std::function<bool(const json& rule, const RuleSource&)>& visit) {
  for (const json& rule : authenticatedRules()) {
    if (visit(rule, {"ClusterRoleBinding", "system:basic-user", "ClusterRole", "system:discovery", "Group \"system:authenticated\""})) return;
  }
  auto walk = [&](const std::string& key, const std::string& bindingNs, const char* bindingKind) {
    for (const json* b : store.list(key, bindingNs)) {
      const json subjects = b->value("subjects", json::array());
      if (!appliesTo(user, subjects, bindingNs)) continue;
      const json roleRef = b->value("roleRef", json::object());
      if (bindingNs.empty() && str(roleRef, "kind") != "ClusterRole") {
        errors.push_back(strCat("ClusterRoleBinding \"", nameOf(*b), "\" refers to a ", str(roleRef, "kind"),
                                " (only a ClusterRole can be)"));
        continue;
      }
      RoleRules r = roleRefRules(store, roleRef, bindingNs);
      if (r.rules == nullptr) {
        errors.push_back(r.error);
        continue;
      }
      RuleSource source{bindingKind, nameOf(*b), str(roleRef, "kind"), str(roleRef, "name"),
                        describeSubject(user, subjects, bindingNs)};
      for (const json& rule : *r.rules) {
        if (visit(rule, source)) return true;
      }
    }
    return false;
  };
  if (walk(kClusterRoleBindings, "", "ClusterRoleBinding")) return;
  if (!ns.empty()) walk(kRoleBindings, ns, "RoleBinding");
}

std::string errorsReason(const std::vector<std::string>& errors) {
  if (errors.empty()) return "";
  if (errors.size() == 1) return strCat("RBAC: ", errors[0]);
  return strCat("RBAC: [", absl::StrJoin(errors, ", "), "]");
}

// The permissions of `rules` one by one (rbac's BreakdownRule).
std::vector<json> breakdown(const json& rules) {
  std::vector<json> out;
  if (!rules.is_array()) return out;
  for (const json& rule : rules) {
    const std::vector<std::string> verbs = strings(rule, "verbs");
    for (const std::string& url : strings(rule, "nonResourceURLs")) {
      for (const std::string& verb : verbs) out.push_back({{"verbs", {verb}}, {"nonResourceURLs", {url}}});
    }
    std::vector<std::string> names = strings(rule, "resourceNames");
    if (names.empty()) names.push_back("");
    for (const std::string& group : strings(rule, "apiGroups")) {
      for (const std::string& resource : strings(rule, "resources")) {
        for (const std::string& verb : verbs) {
          for (const std::string& name : names) {
            json one = {{"verbs", {verb}}, {"apiGroups", {group}}, {"resources", {resource}}};
            if (!name.empty()) one["resourceNames"] = {name};
            out.push_back(std::move(one));
          }
        }
      }
    }
  }
  return out;
}

// Whether `owner` grants everything the one-permission rule `servant` does (rbac's Covers).
bool covers(const json& owner, const json& servant) {
  const std::vector<std::string> verbs = strings(owner, "verbs");
  if (!hasOrAll(verbs, strings(servant, "verbs")[0])) return false;
  if (servant.contains("nonResourceURLs")) {
    const std::string url = strings(servant, "nonResourceURLs")[0];
    for (const std::string& o : strings(owner, "nonResourceURLs")) {
      if (o == "*" || o == url || (o.ends_with("*") && url.starts_with(o.substr(0, o.size() - 1)))) return true;
    }
    return false;
  }
  if (!hasOrAll(strings(owner, "apiGroups"), strings(servant, "apiGroups")[0])) return false;
  const std::string resource = strings(servant, "resources")[0];
  bool resourceCovered = false;
  for (const std::string& o : strings(owner, "resources")) {
    const size_t slash = resource.find('/');
    if (o == "*" || o == resource ||
        (slash != std::string::npos && o == strCat("*", resource.substr(slash))) ||
        (slash != std::string::npos && o == strCat(resource.substr(0, slash), "/*"))) {
      resourceCovered = true;
    }
  }
  if (!resourceCovered) return false;
  const std::vector<std::string> ownerNames = strings(owner, "resourceNames");
  if (ownerNames.empty()) return true;
  const std::vector<std::string> names = strings(servant, "resourceNames");
  return !names.empty() && has(ownerNames, names[0]);
}

std::string compact(const json& rule) {
  std::vector<std::string> parts;
  // As rbac's CompactString prints a PolicyRule.
  for (const auto& [key, label] : std::vector<std::pair<const char*, const char*>>{{"apiGroups", "APIGroups"},
                                                                                  {"resources", "Resources"},
                                                                                  {"resourceNames", "ResourceNames"},
                                                                                  {"nonResourceURLs", "NonResourceURLs"},
                                                                                  {"verbs", "Verbs"}}) {
    if (rule.contains(key)) parts.push_back(strCat(label, ":", rule[key].dump()));
  }
  return strCat("{", absl::StrJoin(parts, ", "), "}");
}

// The object a write of an RBAC object leaves (the body, or the patch applied
// to `current`); null when that cannot be worked out (the handler refuses it).
json resultingObject(const http::Request& req, const RequestAttributes& a, const json* current) {
  // A body the write's own handler refuses (naming what is wrong) gives null.
  if (req.method() != "PATCH") {
    try {
      return requestObject(req, a.resource == "roles" ? "Role" : a.resource == "clusterroles" ? "ClusterRole"
                                : a.resource == "rolebindings" ? "RoleBinding" : "ClusterRoleBinding",
                           strCat(kRbacGroup, "/", a.apiVersion));
    } catch (const ApiError&) {
      return nullptr;
    }
  }
  const std::string type = req.header("Content-Type").value_or("");
  if (type.starts_with("application/apply-patch")) {
    try {
      return yamlToJson(req.body());
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  const json body = json::parse(req.body(), nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || current == nullptr) return nullptr;
  if (type.starts_with("application/merge-patch+json")) return applyMergePatch(*current, body);
  if (type.starts_with("application/json-patch+json")) return applyJsonPatch(*current, body);
  if (type.starts_with("application/strategic-merge-patch+json")) return applyStrategicMergePatch(*current, body);
  return nullptr;
}

}  // namespace

RequestAttributes requestAttributes(const http::Request& req) {
  RequestAttributes a;
  a.path = req.path();
  a.verb = absl::AsciiStrToLower(req.method());
  std::vector<std::string> parts = splitPath(req.path());
  const bool core = !parts.empty() && parts[0] == "api";
  const bool groups = !parts.empty() && parts[0] == "apis";
  if ((!core && !groups) || parts.size() < (core ? 3u : 4u)) return a;
  a.resourceRequest = true;
  size_t i = 1;
  if (groups) a.apiGroup = parts[i++];
  a.apiVersion = parts[i++];
  parts.erase(parts.begin(), parts.begin() + static_cast<long>(i));
  bool watchPath = false;
  if (parts[0] == "watch" && parts.size() >= 2) {  // the old /api/v1/watch/... form
    watchPath = true;
    parts.erase(parts.begin());
  } else {
    const std::string& m = req.method();
    a.verb = m == "POST" ? "create" : m == "GET" || m == "HEAD" ? "get" : m == "PUT" ? "update" : m == "PATCH" ? "patch"
           : m == "DELETE" ? "delete" : "";
  }
  if (parts[0] == "namespaces" && parts.size() > 1) {
    a.ns = parts[1];
    // namespaces/<n>/status and /finalize are the namespace's own subresources.
    if (parts.size() > 2 && parts[2] != "status" && parts[2] != "finalize") parts.erase(parts.begin(), parts.begin() + 2);
  }
  a.resource = parts[0];
  if (parts.size() >= 2) a.name = parts[1];
  if (parts.size() >= 3 && !watchPath) a.subresource = parts[2];
  if (watchPath) a.verb = "watch";
  if (a.name.empty() && a.verb == "get") {
    a.verb = isWatch(req) ? "watch" : "list";
    a.name = pinnedName(req);
  } else if (a.name.empty() && a.verb == "watch") {
    a.name = pinnedName(req);
  }
  if (a.name.empty() && a.verb == "delete") a.verb = "deletecollection";
  return a;
}

bool ruleAllows(const json& rule, const RequestAttributes& a) {
  if (!rule.is_object() || !hasOrAll(strings(rule, "verbs"), a.verb)) return false;
  if (!a.resourceRequest) {
    for (const std::string& url : strings(rule, "nonResourceURLs")) {
      if (url == "*" || url == a.path || (url.ends_with("*") && a.path.starts_with(url.substr(0, url.size() - 1)))) {
        return true;
      }
    }
    return false;
  }
  if (!hasOrAll(strings(rule, "apiGroups"), a.apiGroup)) return false;
  const std::string combined = a.subresource.empty() ? a.resource : strCat(a.resource, "/", a.subresource);
  bool resource = false;
  for (const std::string& r : strings(rule, "resources")) {
    if (r == "*" || r == combined || (!a.subresource.empty() && r == strCat("*/", a.subresource))) resource = true;
  }
  if (!resource) return false;
  const std::vector<std::string> names = strings(rule, "resourceNames");
  return names.empty() || has(names, a.name);
}

Decision authorize(const Store& store, const UserInfo& user, const RequestAttributes& a) {
  if (user.inGroup("system:masters")) return {true, ""};
  std::vector<std::string> errors;
  Decision d;
  visitRules(store, user, a.ns, errors, [&](const json& rule, const RuleSource& s) {
    if (!ruleAllows(rule, a)) return false;
    d = {true, strCat("RBAC: allowed by ", s.bindingKind, " \"", s.bindingName, "\" of ", s.roleKind, " \"", s.roleName,
                      "\" to ", s.subject)};
    return true;
  });
  if (!d.allowed) d.reason = errorsReason(errors);
  return d;
}

ApiError forbiddenError(const UserInfo& user, const RequestAttributes& a, const std::string& reason) {
  std::string msg;
  if (!a.resourceRequest) {
    msg = strCat("User \"", user.name, "\" cannot ", a.verb, " path \"", a.path, "\"");
  } else {
    const std::string resource = a.subresource.empty() ? a.resource : strCat(a.resource, "/", a.subresource);
    msg = strCat("User \"", user.name, "\" cannot ", a.verb, " resource \"", resource, "\" in API group \"", a.apiGroup,
                 "\"", a.ns.empty() ? " at the cluster scope" : strCat(" in the namespace \"", a.ns, "\""));
  }
  if (!reason.empty()) msg = strCat(msg, ": ", reason);
  // apierrors.NewForbidden(GroupResource, name, err).
  std::string qualified = a.apiGroup.empty() ? a.resource : strCat(a.resource, ".", a.apiGroup);
  std::string message = !a.resourceRequest ? strCat("forbidden: ", msg)
                        : a.name.empty()   ? strCat(qualified, " is forbidden: ", msg)
                                           : strCat(qualified, " \"", a.name, "\" is forbidden: ", msg);
  ApiError e(403, "Forbidden", message);
  e.details = {{"group", a.apiGroup}, {"kind", a.resource}};
  if (!a.name.empty()) e.details["name"] = a.name;
  return e;
}

void checkEscalation(const Store& store, const UserInfo& user, const RequestAttributes& a, const http::Request& req) {
  if (!a.resourceRequest || a.apiGroup != kRbacGroup || !a.subresource.empty() ||
      (a.verb != "create" && a.verb != "update" && a.verb != "patch") || user.inGroup("system:masters")) {
    return;
  }
  const bool role = a.resource == "roles" || a.resource == "clusterroles";
  const bool binding = a.resource == "rolebindings" || a.resource == "clusterrolebindings";
  if (!role && !binding) return;
  const json* current = a.name.empty() ? nullptr : store.get(strCat(kRbacGroup, "/", a.resource), a.ns, a.name);
  const json obj = resultingObject(req, a, current);
  if (!obj.is_object()) return;
  const std::string name = a.name.empty() ? nameOf(obj) : a.name;
  RequestAttributes named = a;
  named.name = name;
  json rules;
  std::string granting;
  if (role) {
    if (authorize(store, user, {.verb = "escalate", .resourceRequest = true, .apiGroup = kRbacGroup,
                                .resource = a.resource, .ns = a.ns, .name = name}).allowed) {
      return;
    }
    rules = obj.value("rules", json::array());
  } else {
    const json roleRef = obj.value("roleRef", json::object());
    const std::string kind = str(roleRef, "kind");
    if (authorize(store, user, {.verb = "bind", .resourceRequest = true, .apiGroup = kRbacGroup,
                                .resource = kind == "Role" ? "roles" : "clusterroles", .ns = a.ns,
                                .name = str(roleRef, "name")}).allowed) {
      return;
    }
    RoleRules r = roleRefRules(store, roleRef, a.ns);
    if (r.rules == nullptr) {
      ApiError e(404, "NotFound", r.error);
      e.details = {{"name", str(roleRef, "name")}, {"group", kRbacGroup},
                   {"kind", kind == "Role" ? "roles" : "clusterroles"}};
      throw e;
    }
    rules = *r.rules;
  }
  std::vector<json> owned;
  std::vector<std::string> errors;
  visitRules(store, user, a.ns, errors, [&](const json& rule, const RuleSource&) {
    owned.push_back(rule);
    return false;
  });
  std::vector<std::string> missing;
  for (const json& one : breakdown(rules)) {
    if (std::none_of(owned.begin(), owned.end(), [&](const json& o) { return covers(o, one); })) {
      missing.push_back(compact(one));
    }
  }
  if (missing.empty()) return;
  std::vector<std::string> quoted;
  for (const std::string& g : user.groups) quoted.push_back(strCat("\"", g, "\""));
  std::string why = strCat("user \"", user.name, "\" (groups=[", absl::StrJoin(quoted, " "),
                           "]) is attempting to grant RBAC permissions not currently held:\n", absl::StrJoin(missing, "\n"));
  if (!errors.empty()) why = strCat(why, "; resolution errors: [", absl::StrJoin(errors, ", "), "]");
  ApiError e(403, "Forbidden", strCat(a.resource, ".", kRbacGroup, " \"", name, "\" is forbidden: ", why));
  e.details = {{"name", name}, {"group", kRbacGroup}, {"kind", a.resource}};
  throw e;
}

http::Response selfSubjectAccessReview(const http::Request& req, const Store& store, const UserInfo& user) {
  json review = requestObject(req, "SelfSubjectAccessReview", "authorization.k8s.io/v1");
  const json spec = review.value("spec", json::object());
  RequestAttributes a;
  if (const json r = spec.value("resourceAttributes", json()); r.is_object()) {
    a = {.verb = str(r, "verb"), .resourceRequest = true, .apiGroup = str(r, "group"), .apiVersion = str(r, "version"),
         .resource = str(r, "resource"), .subresource = str(r, "subresource"), .ns = str(r, "namespace"),
         .name = str(r, "name")};
  } else if (const json n = spec.value("nonResourceAttributes", json()); n.is_object()) {
    a = {.verb = str(n, "verb"), .path = str(n, "path")};
  } else {
    throw invalid("SelfSubjectAccessReview", "authorization.k8s.io", "",
                  {fieldRequired("spec.resourceAttributes", "exactly one of nonResourceAttributes or resourceAttributes must be specified")});
  }
  const Decision d = authorize(store, user, a);
  review["apiVersion"] = "authorization.k8s.io/v1";
  review["kind"] = "SelfSubjectAccessReview";
  if (!review.contains("metadata")) review["metadata"] = json::object();
  review["metadata"]["creationTimestamp"] = nullptr;
  review["status"] = {{"allowed", d.allowed}};
  if (!d.reason.empty()) review["status"]["reason"] = d.reason;
  return http::Response::json(201, review);
}

}  // namespace tandem::apiserver
