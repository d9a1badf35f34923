// The write verbs of requests.h: request bodies and options in, ObjectWriter
// for the object rules, the reply a real server gives out.

#include <algorithm>

#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/content_types.h"
#include "e2e/apiserver/json_util.h"
#include "e2e/apiserver/object_meta.h"
#include "e2e/apiserver/patch.h"
#include "e2e/apiserver/protobuf.h"
#include "e2e/apiserver/requests.h"
#include "absl/strings/numbers.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using http::Request;
using http::Response;
using nlohmann::json;

json parseJsonOr400(const std::string& body, const char* what) {
  try {
    return json::parse(body);
  } catch (const json::parse_error& e) {
    throw badRequest(strCat("error decoding ", what, ": ", e.what()));
  }
}

namespace {

// The media type without parameters, lowercased ("application/json").
std::string mediaType(const Request& req) {
  std::string ct = req.header("Content-Type").value_or("");
  ct = ct.substr(0, ct.find(';'));
  ct.erase(std::remove(ct.begin(), ct.end(), ' '), ct.end());
  std::transform(ct.begin(), ct.end(), ct.begin(), [](unsigned char c) { return std::tolower(c); });
  return ct;
}

// A create or replace body: JSON, YAML, or protobuf (client-go's typed
// clients) for the kinds protobuf.h has a codec for; a Scale on /scale.
json parseBody(const Request& req, const Target& target) {
  const ResourceType& t = *target.type;
  std::string type = mediaType(req);
  if (type == protobuf::kMediaType) {
    bool scale = target.sub == "scale";
    return decodeProtobufBody(req.body(), scale ? "Scale" : t.kind, scale ? "autoscaling/v1" : t.apiVersion());
  }
  try {
    if (type.empty() || type == "application/json") return json::parse(req.body());
    if (type == "application/yaml") return yamlToJson(req.body());
  } catch (const std::exception& e) {
    throw badRequest(strCat("the object provided is unrecognized (must be of type ", t.kind,
                            "): couldn't get version/kind; json parse error: ", e.what()));
  }
  throw unsupportedMediaType(
      strCat("the body of the request was in an unknown format - accepted media types include: "
             "application/json, application/yaml"));
}

// Writing a Scale: its spec.replicas goes to the object's replicas path.
json scaledObject(const Target& t, const json& current, const json& scale) {
  checkKind(*t.type, scale, true);
  json obj = current;
  json replicas = scale.value("spec", json::object()).value("replicas", json(0));
  if (!replicas.is_number_integer() || replicas.get<int64_t>() < 0) {
    throw invalid("Scale", "autoscaling", t.name,
                  {fieldInvalid("spec.replicas", replicas, "must be greater than or equal to 0")});
  }
  setJsonPath(obj, t.type->scale->specReplicasPath, replicas);
  return obj;
}

// Server-side apply (application/apply-patch+yaml); creates when missing.
Response applyObject(ObjectWriter& writer, Cluster& cluster, const Request& req, const Target& t, const json* current,
                     Call& call) {
  if (t.sub == "scale") throw unsupportedMediaType("apply is not supported on the scale subresource");
  std::string manager = req.query("fieldManager").value_or("");
  if (manager.empty()) {
    throw invalid("PatchOptions", "meta.k8s.io", "", {fieldRequired("fieldManager", "is required for apply patch")});
  }
  bool force = req.query("force").value_or("") == "true";
  json applied;
  try {
    applied = yamlToJson(req.body());
  } catch (const std::exception& e) {
    throw badRequest(strCat("error decoding YAML: ", e.what()));
  }
  checkKind(*t.type, applied);
  std::string name = meta(applied).value("name", "");
  if (name.empty()) {
    throw invalid(t.type->kind, t.type->group, t.name, {fieldRequired("metadata.name", "name is required")});
  }
  if (name != t.name) {
    throw badRequest(strCat("the name of the object (", name, ") does not match the name on the URL (", t.name, ")"));
  }
  applied["metadata"].erase("managedFields");
  call.manager = manager;
  FieldManager& fields = cluster.fields;
  if (current == nullptr) {
    if (!t.sub.empty()) throw notFound(t.type->plural, t.type->group, t.name);
    json created = writer.create(*t.type, t.ns, applied, call);
    fields.forget(uidOf(created));
    auto result = fields.apply(uidOf(created), created, applied, manager, true, t.type->plural, t.type->group);
    fields.commitApply(uidOf(created), manager, result.fields);
    return Response::json(201, created);
  }
  std::string uid = uidOf(*current);
  auto result = fields.apply(uid, view(*t.type, *current), applied, manager, force, t.type->plural, t.type->group);
  json stored = writer.update(*t.type, *current, result.object, t.sub, false, call);
  fields.commitApply(uid, manager, result.fields);
  return Response::json(200, stored);
}

}  // namespace

Response createObject(ObjectWriter& writer, const Request& req, const Target& t, Call& call) {
  json obj = parseBody(req, t);
  return Response::json(201, writer.create(*t.type, t.ns, std::move(obj), call));
}

Response replaceObject(ObjectWriter& writer, const Cluster& cluster, const Request& req, const Target& t, Call& call) {
  const json* current = cluster.store.get(t.type->storageKey(), t.ns, t.name);
  if (current == nullptr) throw notFound(t.type->plural, t.type->group, t.name);
  json body = parseBody(req, t);
  if (t.sub != "scale") {
    return Response::json(200, writer.update(*t.type, *current, std::move(body), t.sub, t.type->custom, call));
  }
  json obj = scaledObject(t, *current, body);
  std::string rv = resourceVersionOf(body);
  if (!rv.empty()) obj["metadata"]["resourceVersion"] = rv;
  json stored = writer.update(*t.type, *current, obj, "", false, call);
  return Response::json(200, scaleOf(*t.type, stored));
}

Response patchObject(ObjectWriter& writer, Cluster& cluster, const Request& req, const Target& t, Call& call) {
  const std::string type = mediaType(req);
  const json* current = cluster.store.get(t.type->storageKey(), t.ns, t.name);
  if (type == "application/apply-patch+yaml") return applyObject(writer, cluster, req, t, current, call);
  bool smp = type == "application/strategic-merge-patch+json";
  if (type != "application/merge-patch+json" && type != "application/json-patch+json" && !(smp && !t.type->custom)) {
    throw unsupportedMediaType(
        strCat("the body of the request was in an unknown format - accepted media types include: ",
               t.type->custom ? "" : "application/strategic-merge-patch+json, ",
               "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"));
  }
  if (current == nullptr) throw notFound(t.type->plural, t.type->group, t.name);
  json body = parseJsonOr400(req.body(), "patch");
  json base = t.sub == "scale" ? scaleOf(*t.type, *current) : view(*t.type, *current);
  json patched = type == "application/json-patch+json" ? applyJsonPatch(base, body)
                 : smp                                 ? applyStrategicMergePatch(base, body)
                                                       : applyMergePatch(base, body);
  if (t.sub == "scale") {
    json obj = scaledObject(t, *current, patched);
    obj["metadata"]["resourceVersion"] = resourceVersionOf(patched);
    json stored = writer.update(*t.type, *current, view(*t.type, obj), "", false, call);
    return Response::json(200, scaleOf(*t.type, stored));
  }
  return Response::json(200, writer.update(*t.type, *current, std::move(patched), t.sub, false, call));
}

namespace {

// The DeleteOptions of a delete: none, JSON, or protobuf (client-go's typed clients).
json deleteOptionsOf(const Request& req) {
  if (req.body().empty()) return json::object();
  if (mediaType(req) == protobuf::kMediaType) return decodeProtobufBody(req.body(), "DeleteOptions", "");
  return parseJsonOr400(req.body(), "DeleteOptions");
}

DeletionPolicy deletionPolicy(const Request& req, const json& options) {
  std::string policy = options.value("propagationPolicy", req.query("propagationPolicy").value_or("Background"));
  if (options.value("orphanDependents", false)) policy = "Orphan";
  if (policy == "Background") return DeletionPolicy::kBackground;
  if (policy == "Foreground") return DeletionPolicy::kForeground;
  if (policy == "Orphan") return DeletionPolicy::kOrphan;
  throw invalid("DeleteOptions", "meta.k8s.io", "",
                {fieldNotSupported("propagationPolicy", policy, {"Foreground", "Background", "Orphan", "nil"})});
}

// DeleteOptions.gracePeriodSeconds (body or query): a non-negative integer.
std::optional<int64_t> gracePeriodOf(const Request& req, const json& options) {
  json g = options.value("gracePeriodSeconds", json());
  if (g.is_null()) {
    auto q = req.query("gracePeriodSeconds");
    if (!q) return std::nullopt;
    int64_t v = 0;
    if (!absl::SimpleAtoi(*q, &v)) {
      throw invalid("DeleteOptions", "meta.k8s.io", "", {fieldInvalid("gracePeriodSeconds", *q, "must be an integer")});
    }
    g = v;
  }
  if (!g.is_number_integer() || g.get<int64_t>() < 0) {
    throw invalid("DeleteOptions", "meta.k8s.io", "",
                  {fieldInvalid("gracePeriodSeconds", g, "must be a non-negative integer")});
  }
  return g.get<int64_t>();
}

// DeleteOptions.preconditions: 409 unless the object still has that uid / resourceVersion.
void checkPreconditions(const Target& t, const json& options, const json& current) {
  json pre = options.value("preconditions", json::object());
  if (pre.contains("uid") && pre["uid"] != uidOf(current)) {
    throw conflict(t.type->plural, t.type->group, t.name,
                   strCat("Precondition failed: UID in precondition: ", pre["uid"].get<std::string>(),
                          ", UID in object meta: ", uidOf(current)));
  }
  if (pre.contains("resourceVersion") && pre["resourceVersion"] != resourceVersionOf(current)) {
    throw conflict(
        t.type->plural, t.type->group, t.name,
        strCat("Precondition failed: ResourceVersion in precondition: ", pre["resourceVersion"].get<std::string>(),
               ", ResourceVersion in object meta: ", resourceVersionOf(current)));
  }
}

}  // namespace

// 200 Status Success when the object is gone at once; otherwise the object
// as it now is (202 while it waits for finalizers).
Response deleteObject(ObjectWriter& writer, const Cluster& cluster, const Request& req, const Target& t) {
  json options = deleteOptionsOf(req);
  DeletionPolicy policy = deletionPolicy(req, options);
  const json* current = cluster.store.get(t.type->storageKey(), t.ns, t.name);
  if (current == nullptr) throw notFound(t.type->plural, t.type->group, t.name);
  checkPreconditions(t, options, *current);
  json before = *current;
  std::optional<int64_t> grace = gracePeriodOf(req, options);
  writer.remove({before}, policy, grace);
  const json* now = cluster.store.get(t.type->storageKey(), t.ns, t.name);
  if (now == nullptr) {
    json details = {{"name", t.name}, {"kind", t.type->plural}, {"uid", uidOf(before)}};
    if (!t.type->group.empty()) details["group"] = t.type->group;
    return Response::json(200, {{"kind", "Status"},
                                {"apiVersion", "v1"},
                                {"metadata", json::object()},
                                {"status", "Success"},
                                {"details", details}});
  }
  // Kept: 202 while finalizers hold it, 200 while a grace period runs (a pod on a node).
  return Response::json(finalizersOf(*now).empty() ? 200 : 202, view(*t.type, *now));
}

Response deleteCollection(ObjectWriter& writer, const Cluster& cluster, const Request& req, const Target& t) {
  Selector labels = Selector::parseLabels(req.query("labelSelector").value_or(""));
  Selector fields = Selector::parseFields(req.query("fieldSelector").value_or(""), t.type->custom);
  std::vector<json> victims;
  json items = json::array();
  for (const json* o : cluster.store.list(t.type->storageKey(), t.ns)) {
    if (!labels.matches(*o) || !fields.matches(*o)) continue;
    victims.push_back(*o);
    items.push_back(view(*t.type, *o));
  }
  writer.remove(victims, DeletionPolicy::kBackground);
  return Response::json(200, {{"kind", t.type->listKind},
                              {"apiVersion", t.type->apiVersion()},
                              {"metadata", {{"resourceVersion", std::to_string(cluster.store.currentRv())}}},
                              {"items", items}});
}

}  // namespace tandem::apiserver
