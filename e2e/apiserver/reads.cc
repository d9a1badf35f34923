// The read verbs of requests.h.

#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/discovery.h"
#include "e2e/apiserver/json_util.h"
#include "e2e/apiserver/object_meta.h"
#include "e2e/apiserver/requests.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using http::Request;
using http::Response;
using nlohmann::json;

bool wantsTable(const Request& req) { return req.header("Accept").value_or("").find("as=Table") != std::string::npos; }

bool isWatch(const Request& req) {
  std::string w = req.query("watch").value_or("");
  return w == "true" || w == "1";
}

json scaleOf(const ResourceType& t, const json& obj) {
  const ScalePaths& p = *t.scale;
  auto spec = evalJsonPath(obj, p.specReplicasPath);
  auto status = evalJsonPath(obj, p.statusReplicasPath);
  json scale = {{"kind", "Scale"},
                {"apiVersion", "autoscaling/v1"},
                {"metadata",
                 {{"name", nameOf(obj)},
                  {"uid", uidOf(obj)},
                  {"resourceVersion", resourceVersionOf(obj)},
                  {"creationTimestamp", meta(obj).value("creationTimestamp", "")}}},
                {"spec", {{"replicas", spec && spec->is_number() ? *spec : json(0)}}},
                {"status", {{"replicas", status && status->is_number() ? *status : json(0)}}}};
  if (t.namespaced) scale["metadata"]["namespace"] = nsOf(obj);
  if (!p.labelSelectorPath.empty()) {
    auto sel = evalJsonPath(obj, p.labelSelectorPath);
    if (sel) scale["status"]["selector"] = formatLabelSelector(*sel);
  }
  return scale;
}

Response getObject(const Cluster& cluster, const Request& req, const Target& t) {
  const json* current = cluster.store.get(t.type->storageKey(), t.ns, t.name);
  if (current == nullptr) throw notFound(t.type->plural, t.type->group, t.name);
  if (t.sub == "scale") return Response::json(200, scaleOf(*t.type, *current));
  json v = view(*t.type, *current);
  if (wantsTable(req) && t.sub.empty()) {
    return Response::json(200, tableDoc(*t.type, {v}, resourceVersionOf(v), req.query("includeObject").value_or(""),
                                        true, cluster.clock.wallNow()));
  }
  return Response::json(200, v);
}

Response listObjects(const Cluster& cluster, const Request& req, const Target& t) {
  Selector labels = Selector::parseLabels(req.query("labelSelector").value_or(""));
  Selector fields = Selector::parseFields(req.query("fieldSelector").value_or(""), t.type->custom);
  std::vector<json> items;
  for (const json* o : cluster.store.list(t.type->storageKey(), t.ns)) {
    if (labels.matches(*o) && fields.matches(*o)) items.push_back(view(*t.type, *o));
  }
  std::string rv = std::to_string(cluster.store.currentRv());
  if (wantsTable(req)) {
    return Response::json(
        200, tableDoc(*t.type, items, rv, req.query("includeObject").value_or(""), true, cluster.clock.wallNow()));
  }
  return Response::json(200, {{"kind", t.type->listKind},
                              {"apiVersion", t.type->apiVersion()},
                              {"metadata", {{"resourceVersion", rv}}},
                              {"items", items}});
}

WatchSpec watchSpec(const Request& req, const Target& t, Duration limit) {
  WatchSpec s;
  s.type = *t.type;
  s.ns = t.ns;
  s.labels = Selector::parseLabels(req.query("labelSelector").value_or(""));
  s.fields = Selector::parseFields(req.query("fieldSelector").value_or(""), t.type->custom);
  s.table = wantsTable(req);
  s.includeObject = req.query("includeObject").value_or("");
  s.bookmarks = req.query("allowWatchBookmarks").value_or("") == "true";
  s.limit = limit;
  if (auto ts = req.query("timeoutSeconds")) {
    try {
      s.limit = std::min(s.limit, Duration(std::chrono::seconds(std::stoll(*ts))));
    } catch (...) {
      throw badRequest(strCat("invalid value for timeoutSeconds: ", *ts));
    }
  }
  s.resourceVersion = req.query("resourceVersion").value_or("");
  s.sendInitialEvents = req.query("sendInitialEvents").value_or("") == "true";
  if (s.sendInitialEvents && (req.query("resourceVersionMatch").value_or("") != "NotOlderThan" || !s.bookmarks)) {
    throw invalid(
        "ListOptions", "meta.k8s.io", "",
        {fieldForbidden("sendInitialEvents",
                        "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled "
                        "and resourceVersionMatch is NotOlderThan and allowWatchBookmarks is true")});
  }
  const std::string& rv = s.resourceVersion;
  if (!rv.empty() && rv != "0" && rv.find_first_not_of("0123456789") != std::string::npos) {
    throw badRequest(strCat("invalid resource version: ", rv));
  }
  return s;
}

}  // namespace tandem::apiserver
