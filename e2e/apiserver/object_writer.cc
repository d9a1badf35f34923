#include "e2e/apiserver/object_writer.h"

#include <algorithm>
#include <regex>

#include "e2e/apiserver/api_error.h"
#include "e2e/apiserver/json_util.h"
#include "e2e/apiserver/object_meta.h"
#include "e2e/apiserver/schema.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

namespace {

const std::regex kDnsSubdomain(R"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)");
const std::regex kDnsLabel(R"([a-z0-9]([-a-z0-9]*[a-z0-9])?)");

constexpr const char* kLabelMessage =
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
constexpr const char* kSubdomainMessage =
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

// An object without the parts that do not count for metadata.generation.
json specPart(json o) {
  o.erase("metadata");
  o.erase("status");
  o.erase("apiVersion");
  o.erase("kind");
  return o;
}

std::vector<StatusCause> metadataCauses(const json& obj, NameRule rule) {
  std::vector<StatusCause> causes;
  const std::string name = nameOf(obj);
  bool label = rule == NameRule::kDnsLabel;
  if (name.size() > (label ? 63u : 253u) || !std::regex_match(name, label ? kDnsLabel : kDnsSubdomain)) {
    causes.push_back(fieldInvalid("metadata.name", name, label ? kLabelMessage : kSubdomainMessage));
  }
  for (const char* field : {"labels", "annotations"}) {
    if (!meta(obj).contains(field)) continue;
    const json& m = obj["metadata"][field];
    if (!m.is_object()) {
      causes.push_back(fieldTypeInvalid(strCat("metadata.", field), m, "must be a map of strings"));
      continue;
    }
    for (const auto& [k, v] : m.items()) {
      if (!v.is_string()) causes.push_back(fieldTypeInvalid(strCat("metadata.", field, ".", k), v, "must be a string"));
    }
  }
  return causes;
}

// Everything outside status that the caller may not change on an update.
void keepServerFields(json& md, const json& current) {
  for (const char* k : {"name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                        "deletionGracePeriodSeconds", "generation", "resourceVersion"}) {
    if (meta(current).contains(k)) {
      md[k] = current["metadata"][k];
    } else {
      md.erase(k);
    }
  }
  md.erase("managedFields");
}

}  // namespace

void checkKind(const ResourceType& t, const json& obj, bool scale) {
  if (!obj.is_object()) {
    throw badRequest(strCat("the object provided is unrecognized (must be of type ", t.kind, "): ", obj.dump()));
  }
  std::string want = scale ? "autoscaling/v1" : t.apiVersion();
  std::string kind = scale ? "Scale" : t.kind;
  std::string haveKind = obj.value("kind", "");
  std::string haveVersion = obj.value("apiVersion", "");
  if (haveKind.empty()) throw badRequest(strCat("Object 'Kind' is missing in '", obj.dump(), "'"));
  if (haveVersion.empty()) throw badRequest(strCat("Object 'apiVersion' is missing in '", obj.dump(), "'"));
  if (haveVersion != want) {
    throw badRequest(
        strCat("the API version in the data (", haveVersion, ") does not match the expected API version (", want, ")"));
  }
  if (haveKind != kind) {
    throw badRequest(strCat("the kind in the data (", haveKind, ") does not match the expected kind (", kind, ")"));
  }
  if (obj.contains("metadata") && !obj["metadata"].is_object()) {
    throw badRequest(
        strCat(kind, " in version \"", t.version, "\" cannot be handled as a ", kind, ": metadata must be an object"));
  }
}

void ObjectWriter::validate(const ResourceType& t, json& obj, Call& call, const json* old) {
  const TypeHooks& hooks = cluster_.hooks.of(t);
  std::vector<StatusCause> causes = metadataCauses(obj, hooks.nameRule);
  if (t.schema) {
    std::vector<std::string> unknown = pruneUnknownFields(*t.schema, obj);
    if (call.fieldValidation == "Strict") {
      // 422 Invalid with a cause per unknown field, as K8S_API_NOTES.md
      // records kubectl expecting under fieldValidation=Strict.
      for (const auto& u : unknown) {
        causes.push_back(StatusCause{"FieldValueInvalid", strCat("unknown field \"", u, "\""), u});
      }
    } else if (call.fieldValidation != "Ignore") {
      for (const auto& u : unknown) call.warnings.push_back(strCat("unknown field \\\"", u, "\\\""));
    }
    applyDefaults(*t.schema, obj);
    auto schemaErrors = validateSchema(*t.schema, obj, old);
    causes.insert(causes.end(), schemaErrors.begin(), schemaErrors.end());
  }
  if (!causes.empty()) throw invalid(t.kind, t.group, nameOf(obj), causes);
  if (hooks.validate) hooks.validate(obj);
}

void ObjectWriter::defaults(const ResourceType& t, json& obj, const json* current) {
  const TypeHooks& hooks = cluster_.hooks.of(t);
  if (hooks.defaults) {
    hooks.defaults(obj, {.current = current, .currentRv = cluster_.store.currentRv(), .now = cluster_.clock.wallNow()});
  }
}

void ObjectWriter::stored(const ResourceType& t, const json& obj) {
  const TypeHooks& hooks = cluster_.hooks.of(t);
  if (hooks.stored) hooks.stored(obj, cluster_);
}

// 404 for a missing namespace, 403 for a terminating one, 409 for a name taken.
void ObjectWriter::checkCreatable(const ResourceType& t, const std::string& ns, const std::string& name) {
  if (t.namespaced) {
    const json* nsObj = cluster_.store.get("/namespaces", "", ns);
    if (nsObj == nullptr) throw notFound("namespaces", "", ns);
    if (deleting(*nsObj)) {
      ApiError e = forbidden(strCat(t.plural, (t.group.empty() ? "" : "." + t.group), " \"", name,
                                    "\" is forbidden: unable to create new content in namespace ", ns,
                                    " because it is being terminated"));
      e.details = {{"name", name},
                   {"kind", t.plural},
                   {"causes", json::array({{{"reason", "NamespaceTerminating"},
                                            {"message", strCat("namespace ", ns, " is being terminated")},
                                            {"field", "metadata.namespace"}}})}};
      if (!t.group.empty()) e.details["group"] = t.group;
      throw e;
    }
  }
  if (cluster_.store.get(t.storageKey(), ns, name) != nullptr) throw alreadyExists(t.plural, t.group, name);
}

json ObjectWriter::create(const ResourceType& t, const std::string& ns, json obj, Call& call) {
  checkKind(t, obj);
  if (!obj.contains("metadata")) obj["metadata"] = json::object();
  json& md = obj["metadata"];
  if (t.namespaced) {
    std::string have = md.value("namespace", "");
    if (!have.empty() && have != ns) {
      throw badRequest("the namespace of the provided object does not match the namespace sent on the request");
    }
    md["namespace"] = ns;
  } else {
    md.erase("namespace");
  }
  if (md.value("name", "").empty() && !md.value("generateName", "").empty()) {
    md["name"] = md["generateName"].get<std::string>() + randomSuffix(5);
  }
  std::string name = md.value("name", "");
  if (name.empty()) {
    throw invalid(t.kind, t.group, "", {fieldRequired("metadata.name", "name or generateName is required")});
  }
  if (!md.value("resourceVersion", "").empty()) {
    throw badRequest("resourceVersion should not be set on objects to be created");
  }
  checkCreatable(t, ns, name);
  md["uid"] = newUid();
  md["creationTimestamp"] = rfc3339(cluster_.clock.wallNow());
  for (const char* k : {"deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"}) md.erase(k);
  if (t.hasGeneration) md["generation"] = 1;
  if (t.hasStatus) obj.erase("status");
  if (!obj.contains("spec") && cluster_.hooks.of(t).specOnCreate) obj["spec"] = json::object();
  defaults(t, obj, nullptr);
  validate(t, obj, call);
  json result = cluster_.store.put(t.storageKey(), obj);
  cluster_.fields.recordUpdate(uidOf(result), nullptr, result, call.manager);
  stored(t, result);
  collectGarbage();
  return view(t, result);
}

json ObjectWriter::update(const ResourceType& t, const json& current, json updated, const std::string& sub,
                          bool requireRv, Call& call) {
  checkKind(t, updated);
  if (!updated.contains("metadata")) updated["metadata"] = json::object();
  json& md = updated["metadata"];
  const std::string name = nameOf(current);
  std::string haveName = md.value("name", "");
  if (!haveName.empty() && haveName != name) {
    throw badRequest(strCat("the name of the object (", haveName, ") does not match the name on the URL (", name, ")"));
  }
  if (t.namespaced && !md.value("namespace", "").empty() && md["namespace"] != nsOf(current)) {
    throw badRequest("the namespace of the provided object does not match the namespace sent on the request");
  }
  std::string rv = md.value("resourceVersion", "");
  if (rv.empty() && requireRv) {
    throw invalid(t.kind, t.group, name,
                  {fieldInvalid("metadata.resourceVersion", "0x0", "must be specified for an update")});
  }
  if (!rv.empty() && rv != resourceVersionOf(current)) throw staleConflict(t.plural, t.group, name);
  keepServerFields(md, current);
  // `md` is not used below: `updated` may be replaced.
  if (sub == "status") {
    json result = current;
    if (updated.contains("status")) {
      result["status"] = updated["status"];
    } else {
      result.erase("status");
    }
    updated = std::move(result);
  } else if (t.hasStatus) {
    if (current.contains("status")) {
      updated["status"] = current["status"];
    } else {
      updated.erase("status");
    }
  }
  updated["apiVersion"] = current.value("apiVersion", t.apiVersion());
  updated["kind"] = t.kind;
  defaults(t, updated, &current);
  // Updates of status only validate too (the schema covers status).
  validate(t, updated, call, &current);
  if (deleting(current)) {
    auto before = finalizersOf(current);
    for (const auto& f : finalizersOf(updated)) {
      if (std::find(before.begin(), before.end(), f) == before.end()) {
        throw invalid(
            t.kind, t.group, name,
            {fieldForbidden("metadata.finalizers", "no new finalizers can be added if the object is being deleted")});
      }
    }
  }
  if (t.hasGeneration && specPart(updated) != specPart(current)) {
    updated["metadata"]["generation"] = meta(current).value("generation", 0) + 1;
  }
  json currentNormal = current;
  currentNormal["apiVersion"] = updated["apiVersion"];
  if (updated == currentNormal) return view(t, current);  // a no-op write keeps the resourceVersion

  json result = cluster_.store.put(t.storageKey(), updated);
  cluster_.fields.recordUpdate(uidOf(result), current, result, call.manager);
  stored(t, result);
  collectGarbage();  // erases it if that was its last finalizer
  return view(t, result);
}

bool ObjectWriter::remove(const std::vector<json>& objects, DeletionPolicy policy, std::optional<int64_t> grace) {
  GcPlanner plan(gcSnapshot(cluster_));
  bool firstGone = false;
  for (size_t i = 0; i < objects.size(); ++i) {
    bool gone = plan.requestDeletion(uidOf(objects[i]), policy);
    if (i == 0) firstGone = gone;
    if (grace) requestedGrace_[uidOf(objects[i])] = *grace;
  }
  plan.collect();
  const bool more = apply(plan.actions());
  requestedGrace_.clear();
  if (more) collectGarbage();
  return firstGone;
}

void ObjectWriter::collectGarbage() {
  // One planned pass sees the whole cascade; only a type hook that erases
  // more on its own (a CRD's objects) calls for another.
  bool again = true;
  while (again) {
    GcPlanner plan(gcSnapshot(cluster_));
    plan.collect();
    again = apply(plan.actions());
  }
}

bool ObjectWriter::apply(const std::vector<GcAction>& actions) {
  bool more = false;
  for (const GcAction& a : actions) {
    const json* current = cluster_.store.get(a.storageKey, a.ns, a.name);
    if (current == nullptr) continue;
    json o = *current;
    switch (a.type) {
      case GcActionType::kSetOwnerReferences:
        if (a.ownerReferences.empty()) {
          o["metadata"].erase("ownerReferences");
        } else {
          o["metadata"]["ownerReferences"] = a.ownerReferences;
        }
        break;
      case GcActionType::kMarkDeleting:
        if (!deleting(o)) {
          o["metadata"]["deletionTimestamp"] = rfc3339(cluster_.clock.wallNow());
          o["metadata"]["deletionGracePeriodSeconds"] = 0;
        }
        if (cluster_.hooks.of(a.storageKey).keptUntilEmpty) o["status"]["phase"] = "Terminating";
        setFinalizers(o, a.finalizers);
        break;
      case GcActionType::kSetFinalizers:
        setFinalizers(o, a.finalizers);
        break;
      case GcActionType::kErase: {
        const json before = o;
        if (keepForGrace(a.storageKey, o)) {
          if (o == before) continue;  // its grace still runs: nothing to write
          break;
        }
        more = erase(a.storageKey, o) || more;
        continue;
      }
    }
    cluster_.store.put(a.storageKey, std::move(o));
  }
  return more;
}

bool ObjectWriter::keepForGrace(const std::string& storageKey, json& obj) {
  const TypeHooks& hooks = cluster_.hooks.of(storageKey);
  if (!hooks.gracePeriod || !finalizersOf(obj).empty()) return false;
  const std::optional<int64_t> fallback = hooks.gracePeriod(obj);
  if (!fallback) return false;
  auto requested = requestedGrace_.find(uidOf(obj));
  json& md = obj["metadata"];
  const bool marked = md.contains("deletionGracePeriodSeconds") && md["deletionGracePeriodSeconds"].get<int64_t>() > 0;
  if (marked && requested == requestedGrace_.end()) return true;  // its grace still runs
  const int64_t grace = requested != requestedGrace_.end() ? requested->second : *fallback;
  if (grace <= 0) return false;
  if (marked && md["deletionGracePeriodSeconds"].get<int64_t>() <= grace) return true;  // only ever shortened
  md["deletionTimestamp"] = rfc3339(cluster_.clock.wallNow() + std::chrono::seconds(grace));
  md["deletionGracePeriodSeconds"] = grace;
  return true;
}

bool ObjectWriter::erase(const std::string& storageKey, const json& obj) {
  cluster_.store.erase(storageKey, nsOf(obj), nameOf(obj));
  cluster_.fields.forget(uidOf(obj));
  const TypeHooks& hooks = cluster_.hooks.of(storageKey);
  if (!hooks.erased) return false;
  hooks.erased(obj, cluster_);
  return true;
}

}  // namespace tandem::apiserver
