#include "e2e/apiserver/type_hooks.h"

#include "e2e/apiserver/cluster.h"
#include "e2e/apiserver/json_util.h"
#include "e2e/apiserver/object_meta.h"
#include "src/common/strings.h"

namespace tandem::apiserver {

using nlohmann::json;

namespace {

void namespaceDefaults(json& obj, const DefaultsContext& ctx) {
  obj["spec"]["finalizers"] = json::array({"kubernetes"});
  if (ctx.current == nullptr) obj["status"] = {{"phase", "Active"}};
}

void setDefault(json& obj, const char* key, json value) {
  if (!obj.contains(key)) obj[key] = std::move(value);
}

// What the API server defaults in a pod spec (also inside templates).
void podSpecDefaults(json& spec) {
  if (!spec.is_object()) return;
  setDefault(spec, "restartPolicy", "Always");
  setDefault(spec, "terminationGracePeriodSeconds", 30);
  setDefault(spec, "dnsPolicy", "ClusterFirst");
  setDefault(spec, "schedulerName", "default-scheduler");
}

void podDefaults(json& obj, const DefaultsContext& ctx) {
  podSpecDefaults(obj["spec"]);
  if (ctx.current == nullptr && !obj.contains("status")) obj["status"] = {{"phase", "Pending"}};
}

// A pod on a node stops first (its kubelet sends SIGTERM and waits); one
// never scheduled, or whose containers ended for good, goes at once.
std::optional<int64_t> podGracePeriod(const json& pod) {
  if (pod.value("/spec/nodeName"_json_pointer, "").empty()) return std::nullopt;
  const std::string phase = pod.value("/status/phase"_json_pointer, "");
  if (phase == "Succeeded" || phase == "Failed") return std::nullopt;
  return pod.value("/spec/terminationGracePeriodSeconds"_json_pointer, int64_t{30});
}

void replicaSetDefaults(json& obj, const DefaultsContext&) {
  setDefault(obj["spec"], "replicas", 1);
  if (obj["spec"].contains("template")) podSpecDefaults(obj["spec"]["template"]["spec"]);
}

void deploymentDefaults(json& obj, const DefaultsContext&) {
  json& spec = obj["spec"];
  setDefault(spec, "replicas", 1);
  setDefault(spec, "revisionHistoryLimit", 10);
  setDefault(spec, "progressDeadlineSeconds", 600);
  setDefault(spec, "strategy", json{{"type", "RollingUpdate"}});
  if (spec["strategy"].value("type", "") == "RollingUpdate") {
    json& ru = spec["strategy"]["rollingUpdate"];
    setDefault(ru, "maxSurge", "25%");
    setDefault(ru, "maxUnavailable", "25%");
  }
  if (spec.contains("template")) podSpecDefaults(spec["template"]["spec"]);
}

void secretDefaults(json& obj, const DefaultsContext&) {
  if (obj.contains("stringData") && obj["stringData"].is_object()) {
    for (const auto& [k, v] : obj["stringData"].items()) {
      obj["data"][k] = base64Encode(v.is_string() ? v.get<std::string>() : v.dump());
    }
    obj.erase("stringData");
  }
  if (!obj.contains("type")) obj["type"] = "Opaque";
}

// A fake ClusterIP from the resourceVersion at creation (10.96.x.y), kept by
// updates; never 10.96.0.1, which a cluster keeps for the `kubernetes` Service.
void serviceDefaults(json& obj, const DefaultsContext& ctx) {
  if (!obj["spec"].contains("type")) obj["spec"]["type"] = "ClusterIP";
  if (!obj["spec"].contains("clusterIP")) {
    const uint64_t third = (ctx.currentRv / 250) % 250, fourth = ctx.currentRv % 250 + 1;
    obj["spec"]["clusterIP"] = ctx.current != nullptr ? (*ctx.current)["spec"].value("clusterIP", "None")
                               : third == 0 && fourth == 1 ? std::string("10.96.0.251")
                                                           : strCat("10.96.", third, ".", fourth);
  }
}

json crdCondition(const std::string& type, const std::string& reason, const std::string& message,
                  const std::string& at) {
  return {{"type", type}, {"status", "True"}, {"reason", reason}, {"message", message}, {"lastTransitionTime", at}};
}

// Completes spec.names and sets the status a real server's CRD controllers
// would (names accepted, established); conditions once set are kept.
void crdDefaults(json& obj, const DefaultsContext& ctx) {
  json names = obj["spec"].value("names", json::object());
  if (!names.contains("singular") && names.contains("kind")) {
    std::string s = names["kind"];
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    names["singular"] = s;
  }
  if (!names.contains("listKind") && names.contains("kind"))
    names["listKind"] = names["kind"].get<std::string>() + "List";
  obj["spec"]["names"] = names;
  std::string at = rfc3339(ctx.now);
  json stored = json::array();
  for (const auto& v : obj["spec"].value("versions", json::array())) {
    if (v.value("storage", false)) stored.push_back(v.value("name", ""));
  }
  obj["status"] = {{"acceptedNames", names},
                   {"storedVersions", stored},
                   {"conditions",
                    {crdCondition("NamesAccepted", "NoConflicts", "no conflicts found", at),
                     crdCondition("Established", "InitialNamesAccepted", "the initial names have been accepted", at)}}};
  if (ctx.current != nullptr && ctx.current->contains("status")) {
    obj["status"]["conditions"] = (*ctx.current)["status"]["conditions"];
  }
}

// events.k8s.io/v1 Events are mirrored as core/v1 Events of the same name,
// so `kubectl get events` and `kubectl describe` (which read core/v1) show
// what controllers record through events.k8s.io (on a real server the two
// are views of one store).
constexpr const char* kMirrorAnnotation = "tandem.dev/mirror-of";

void eventStored(const json& e, Cluster& cluster) {
  const json md = e.value("metadata", json::object());
  const std::string ns = md.value("namespace", ""), name = md.value("name", "");
  const json series = e.value("series", json::object());
  const std::string when = e.value("eventTime", md.value("creationTimestamp", ""));
  std::string last = series.value("lastObservedTime", when);
  // metav1.Time (seconds) from a MicroTime.
  auto seconds = [](std::string t) {
    const size_t dot = t.find('.');
    return dot == std::string::npos ? t : t.substr(0, dot) + "Z";
  };
  json core = {{"apiVersion", "v1"},
               {"kind", "Event"},
               {"metadata",
                {{"name", name},
                 {"namespace", ns},
                 {"uid", md.value("uid", "")},
                 {"creationTimestamp", md.value("creationTimestamp", "")},
                 {"annotations", {{kMirrorAnnotation, "events.k8s.io/v1"}}}}},
               {"involvedObject", e.value("regarding", json::object())},
               {"reason", e.value("reason", "")},
               {"message", e.value("note", "")},
               {"type", e.value("type", "Normal")},
               {"action", e.value("action", "")},
               {"source", {{"component", e.value("reportingController", "")}}},
               {"reportingComponent", e.value("reportingController", "")},
               {"reportingInstance", e.value("reportingInstance", "")},
               {"firstTimestamp", seconds(when)},
               {"lastTimestamp", seconds(last)},
               {"count", series.value("count", 1)}};
  if (!when.empty()) core["eventTime"] = when;
  if (e.contains("related")) core["related"] = e["related"];
  const json* existing = cluster.store.get("/events", ns, name);
  if (existing != nullptr && !existing->contains(json::json_pointer("/metadata/annotations/tandem.dev~1mirror-of"))) {
    return;  // a core/v1 Event of that name written directly: not ours to overwrite
  }
  cluster.store.put("/events", std::move(core));
}

void eventErased(const json& e, Cluster& cluster) {
  const json md = e.value("metadata", json::object());
  const json* mirror = cluster.store.get("/events", md.value("namespace", ""), md.value("name", ""));
  if (mirror != nullptr && mirror->contains(json::json_pointer("/metadata/annotations/tandem.dev~1mirror-of"))) {
    cluster.store.erase("/events", md.value("namespace", ""), md.value("name", ""));
  }
}

// kube-controller-manager's serviceaccount controller: every namespace not
// being deleted has a ServiceAccount "default" (made again when deleted).
void ensureDefaultServiceAccount(const std::string& ns, Cluster& cluster) {
  const json* namespaceObj = cluster.store.get("/namespaces", "", ns);
  if (namespaceObj == nullptr || deleting(*namespaceObj) || cluster.store.get("/serviceaccounts", ns, "default") != nullptr) {
    return;
  }
  cluster.store.put("/serviceaccounts", {{"apiVersion", "v1"},
                                         {"kind", "ServiceAccount"},
                                         {"metadata",
                                          {{"name", "default"},
                                           {"namespace", ns},
                                           {"uid", newUid()},
                                           {"creationTimestamp", rfc3339(cluster.clock.wallNow())}}}});
}

void namespaceStored(const json& obj, Cluster& cluster) { ensureDefaultServiceAccount(nameOf(obj), cluster); }

void serviceAccountErased(const json& sa, Cluster& cluster) {
  if (nameOf(sa) == "default") ensureDefaultServiceAccount(nsOf(sa), cluster);
}

void crdStored(const json& crd, Cluster& cluster) { cluster.types.setCrd(nameOf(crd), typesFromCrd(crd)); }

// A CRD's objects go with it, at once (a real server deletes them in the background).
void crdErased(const json& crd, Cluster& cluster) {
  std::string key = cluster.types.eraseCrd(nameOf(crd));
  if (key.empty()) return;
  for (const json* o : cluster.store.list(key, "")) cluster.fields.forget(uidOf(*o));
  cluster.store.eraseAll(key);
}

}  // namespace

const TypeHooks& TypeHookRegistry::of(const std::string& storageKey) const {
  auto it = byStorageKey_.find(storageKey);
  return it == byStorageKey_.end() ? none_ : it->second;
}

TypeHookRegistry TypeHookRegistry::builtins() {
  TypeHookRegistry r;
  r.add("/namespaces", {.nameRule = NameRule::kDnsLabel,
                        .specOnCreate = true,
                        .keptUntilEmpty = true,
                        .defaults = namespaceDefaults,
                        .stored = namespaceStored});
  r.add("/serviceaccounts", {.erased = serviceAccountErased});
  r.add("/services", {.nameRule = NameRule::kDnsLabel, .specOnCreate = true, .defaults = serviceDefaults});
  r.add("/secrets", {.defaults = secretDefaults});
  r.add("/pods", {.specOnCreate = true, .defaults = podDefaults, .gracePeriod = podGracePeriod});
  r.add("apps/deployments", {.specOnCreate = true, .defaults = deploymentDefaults});
  r.add("events.k8s.io/events", {.stored = eventStored, .erased = eventErased});
  r.add("apps/replicasets", {.specOnCreate = true, .defaults = replicaSetDefaults});
  r.add("apiextensions.k8s.io/customresourcedefinitions", {.defaults = crdDefaults,
                                                           .validate = [](const json& crd) { typesFromCrd(crd); },
                                                           .stored = crdStored,
                                                           .erased = crdErased});
  return r;
}

}  // namespace tandem::apiserver
