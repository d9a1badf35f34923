#include "e2e/kubelet/workloads.h"

#include <algorithm>
#include <cmath>

#include "src/common/strings.h"
#include "src/k8s/resource.h"

namespace tandem::kubelet {

using nlohmann::json;

namespace {

std::string str(const json& j, const json::json_pointer& p) {
  return j.contains(p) && j.at(p).is_string() ? j.at(p).get<std::string>() : "";
}
int64_t num(const json& j, const json::json_pointer& p, int64_t fallback = 0) {
  return j.contains(p) && j.at(p).is_number_integer() ? j.at(p).get<int64_t>() : fallback;
}

bool deleting(const json& o) { return o.contains("/metadata/deletionTimestamp"_json_pointer); }

int64_t deletionCost(const json& pod) {
  const std::string v = str(pod, "/metadata/annotations/controller.kubernetes.io~1pod-deletion-cost"_json_pointer);
  char* end = nullptr;
  const long long cost = std::strtoll(v.c_str(), &end, 10);
  return v.empty() || *end != '\0' ? 0 : cost;
}

int64_t restarts(const json& pod) {
  int64_t n = 0;
  for (const auto& c : pod.value("/status/containerStatuses"_json_pointer, json::array())) n += c.value("restartCount", 0);
  return n;
}

int phaseRank(const json& pod) {
  const std::string phase = str(pod, "/status/phase"_json_pointer);
  return phase == "Pending" ? 0 : phase == "Running" ? 2 : 1;
}

// Whether `a` goes before `b` when a ReplicaSet has too many pods.
bool deleteFirst(const json& a, const json& b) {
  const bool sa = !str(a, "/spec/nodeName"_json_pointer).empty(), sb = !str(b, "/spec/nodeName"_json_pointer).empty();
  if (sa != sb) return !sa;
  if (phaseRank(a) != phaseRank(b)) return phaseRank(a) < phaseRank(b);
  if (podReady(a) != podReady(b)) return !podReady(a);
  if (deletionCost(a) != deletionCost(b)) return deletionCost(a) < deletionCost(b);
  if (restarts(a) != restarts(b)) return restarts(a) > restarts(b);
  const std::string ca = str(a, "/metadata/creationTimestamp"_json_pointer);
  const std::string cb = str(b, "/metadata/creationTimestamp"_json_pointer);
  if (ca != cb) return ca > cb;
  return k8s::objectName(a) < k8s::objectName(b);
}

// maxSurge / maxUnavailable: an int, or a percentage of `replicas`.
int resolve(const json& v, int replicas, bool roundUp, int fallback_percent) {
  if (v.is_number_integer()) return std::max(0, v.get<int>());
  std::string s = v.is_string() ? v.get<std::string>() : strCat(fallback_percent, "%");
  if (!s.empty() && s.back() == '%') {
    const double pct = std::atof(s.substr(0, s.size() - 1).c_str());
    const double x = pct * replicas / 100.0;
    return std::max(0, static_cast<int>(roundUp ? std::ceil(x) : std::floor(x)));
  }
  return std::max(0, std::atoi(s.c_str()));
}

int replicasOf(const json& o) { return static_cast<int>(num(o, "/spec/replicas"_json_pointer, 1)); }

json condition(const std::string& type, bool status, const std::string& reason, const std::string& message,
               const json& previous, const std::string& now, bool progressed) {
  const std::string s = status ? "True" : "False";
  json c = {{"type", type}, {"status", s}, {"reason", reason}, {"message", message},
            {"lastUpdateTime", now}, {"lastTransitionTime", now}};
  for (const auto& p : previous) {
    if (p.value("type", "") != type) continue;
    if (p.value("status", "") == s) c["lastTransitionTime"] = p.value("lastTransitionTime", now);
    if (!progressed && p.value("reason", "") == reason) c["lastUpdateTime"] = p.value("lastUpdateTime", now);
  }
  return c;
}

}  // namespace

bool selectorMatches(const json& selector, const json& labels) {
  if (!selector.is_object() || selector.empty()) return false;
  auto label = [&](const std::string& k) -> std::optional<std::string> {
    if (!labels.is_object() || !labels.contains(k) || !labels[k].is_string()) return std::nullopt;
    return labels[k].get<std::string>();
  };
  const json match_labels = selector.value("matchLabels", json::object());
  for (const auto& [k, v] : match_labels.items()) {
    if (label(k) != (v.is_string() ? std::optional(v.get<std::string>()) : std::nullopt)) return false;
  }
  for (const auto& e : selector.value("matchExpressions", json::array())) {
    const auto have = label(e.value("key", ""));
    const std::string op = e.value("operator", "");
    const json values = e.value("values", json::array());
    const bool in = have && std::find(values.begin(), values.end(), json(*have)) != values.end();
    if ((op == "In" && !in) || (op == "NotIn" && in) || (op == "Exists" && !have) || (op == "DoesNotExist" && have)) {
      return false;
    }
    if (op != "In" && op != "NotIn" && op != "Exists" && op != "DoesNotExist") return false;
  }
  return true;
}

bool controlledBy(const json& obj, const std::string& uid) {
  for (const auto& r : obj.value("/metadata/ownerReferences"_json_pointer, json::array())) {
    if (r.value("controller", false) && r.value("uid", "") == uid) return true;
  }
  return false;
}

json controllerRef(const json& owner, const std::string& apiVersion, const std::string& kind) {
  return {{"apiVersion", apiVersion}, {"kind", kind}, {"name", k8s::objectName(owner)},
          {"uid", k8s::objectUid(owner)}, {"controller", true}, {"blockOwnerDeletion", true}};
}

bool podReady(const json& pod) {
  for (const auto& c : pod.value("/status/conditions"_json_pointer, json::array())) {
    if (c.value("type", "") == "Ready") return c.value("status", "") == "True";
  }
  return false;
}

bool podActive(const json& pod) {
  const std::string phase = str(pod, "/status/phase"_json_pointer);
  return phase != "Succeeded" && phase != "Failed" && !deleting(pod);
}

ReplicaSetPlan planReplicaSet(const json& rs, const std::vector<json>& pods) {
  ReplicaSetPlan plan;
  const std::string uid = k8s::objectUid(rs);
  std::vector<json> active;
  for (const json& p : pods) {
    if (controlledBy(p, uid) && podActive(p)) active.push_back(p);
  }
  const int want = replicasOf(rs);
  const int have = static_cast<int>(active.size());
  if (!deleting(rs)) {
    if (want > have) plan.create = want - have;
    if (want < have) {
      std::sort(active.begin(), active.end(), deleteFirst);
      for (int i = 0; i < have - want; ++i) plan.remove.push_back(k8s::objectName(active[i]));
    }
  }
  int ready = 0;
  for (const json& p : active) ready += podReady(p) ? 1 : 0;
  plan.status = {{"replicas", have},
                 {"fullyLabeledReplicas", have},
                 {"readyReplicas", ready},
                 {"availableReplicas", ready},
                 {"observedGeneration", num(rs, "/metadata/generation"_json_pointer, 1)}};
  return plan;
}

json podFromTemplate(const json& rs) {
  const json& tmpl = rs["spec"]["template"];
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"generateName", k8s::objectName(rs) + "-"},
                {"namespace", k8s::objectNamespace(rs)},
                {"labels", tmpl.value("/metadata/labels"_json_pointer, json::object())},
                {"ownerReferences", json::array({controllerRef(rs, "apps/v1", "ReplicaSet")})}}},
              {"spec", tmpl.value("spec", json::object())}};
  const json annotations = tmpl.value("/metadata/annotations"_json_pointer, json::object());
  if (!annotations.empty()) pod["metadata"]["annotations"] = annotations;
  return pod;
}

// FNV-1a of `text` in Kubernetes' alphabet for names (no vowels, no look-alike digits).
std::string nameHash(std::string_view text, int length) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  static constexpr char kAlphabet[] = "bcdfghjklmnpqrstvwxz2456789";
  std::string out;
  for (int i = 0; i < length; ++i, h /= 27) out.push_back(kAlphabet[h % 27]);
  return out;
}

// Of the canonical JSON (nlohmann sorts object keys).
std::string podTemplateHash(const json& podTemplate) { return nameHash(podTemplate.dump(), 10); }

DeploymentPlan planDeployment(const json& d, const std::vector<json>& replicaSets, const std::vector<json>& pods,
                              WallTime now_time) {
  DeploymentPlan plan;
  const std::string now = k8s::formatTime(now_time);
  const std::string name = k8s::objectName(d);
  const int replicas = replicasOf(d);
  const json& spec = d["spec"];
  const std::string strategy = str(d, "/spec/strategy/type"_json_pointer).empty()
                                   ? "RollingUpdate"
                                   : str(d, "/spec/strategy/type"_json_pointer);
  const json ru = d.value("/spec/strategy/rollingUpdate"_json_pointer, json::object());
  int surge = resolve(ru.value("maxSurge", json("25%")), replicas, true, 25);
  int unavailable = resolve(ru.value("maxUnavailable", json("25%")), replicas, false, 25);
  if (surge == 0 && unavailable == 0) unavailable = 1;
  const std::string hash = podTemplateHash(spec.value("template", json::object()));

  const json* current = nullptr;
  std::vector<const json*> olds;
  int64_t revision = 0;
  for (const json& rs : replicaSets) {
    if (deleting(rs)) continue;
    revision = std::max<int64_t>(
        revision, std::atoll(str(rs, "/metadata/annotations/deployment.kubernetes.io~1revision"_json_pointer).c_str()));
    if (str(rs, "/metadata/labels/pod-template-hash"_json_pointer) == hash) {
      current = &rs;
    } else {
      olds.push_back(&rs);
    }
  }
  std::sort(olds.begin(), olds.end(), [](const json* a, const json* b) {
    return str(*a, "/metadata/creationTimestamp"_json_pointer) < str(*b, "/metadata/creationTimestamp"_json_pointer);
  });
  int old_total = 0, old_pods = 0;
  for (const json* o : olds) {
    old_total += replicasOf(*o);
    // Its pods that have not ended, those still stopping included.
    const std::string uid = k8s::objectUid(*o);
    for (const json& p : pods) {
      const std::string phase = str(p, "/status/phase"_json_pointer);
      if (controlledBy(p, uid) && phase != "Succeeded" && phase != "Failed") ++old_pods;
    }
  }
  const bool paused = spec.value("paused", false);

  // The ReplicaSet of the current template, and its size.
  int new_spec = current ? replicasOf(*current) : 0;
  if (!current && !paused) {
    int initial = replicas;
    if (strategy == "Recreate") {
      initial = old_total + old_pods > 0 ? 0 : replicas;
    } else if (old_total > 0) {
      initial = std::clamp(replicas + surge - old_total, 0, replicas);
    }
    json tmpl = spec.value("template", json::object());
    tmpl["metadata"]["labels"]["pod-template-hash"] = hash;
    json selector = spec.value("selector", json::object());
    selector["matchLabels"]["pod-template-hash"] = hash;
    json labels = tmpl["metadata"]["labels"];
    plan.create = json{{"apiVersion", "apps/v1"},
                       {"kind", "ReplicaSet"},
                       {"metadata",
                        {{"name", strCat(name, "-", hash)},
                         {"namespace", k8s::objectNamespace(d)},
                         {"labels", labels},
                         {"annotations",
                          {{"deployment.kubernetes.io/revision", std::to_string(revision + 1)},
                           {"deployment.kubernetes.io/desired-replicas", std::to_string(replicas)}}},
                         {"ownerReferences", json::array({controllerRef(d, "apps/v1", "Deployment")})}}},
                       {"spec", {{"replicas", initial}, {"selector", selector}, {"template", tmpl}}}};
    new_spec = initial;
  }
  if (!paused) {
    int target_new = new_spec;
    if (strategy == "Recreate") {
      for (const json* o : olds) {
        if (replicasOf(*o) != 0) plan.scale[k8s::objectName(*o)] = 0;
      }
      if (old_pods == 0 && old_total == 0) target_new = replicas;
    } else {
      if (new_spec > replicas || old_total == 0) {
        target_new = replicas;
      } else {
        const int room = replicas + surge - (old_total + new_spec);
        if (room > 0) target_new = std::min(replicas, new_spec + room);
      }
      // Old pods go while enough stay available.
      const int new_available = current ? static_cast<int>(num(*current, "/status/availableReplicas"_json_pointer)) : 0;
      const int new_unavailable = std::max(0, new_spec - new_available);
      int can_remove = (old_total + new_spec) - (replicas - unavailable) - new_unavailable;
      for (const json* o : olds) {
        const int r = replicasOf(*o);
        if (can_remove <= 0 || r == 0) continue;
        const int cut = std::min(r, can_remove);
        plan.scale[k8s::objectName(*o)] = r - cut;
        can_remove -= cut;
      }
    }
    if (current && target_new != replicasOf(*current)) plan.scale[k8s::objectName(*current)] = target_new;
    if (!current && plan.create) (*plan.create)["spec"]["replicas"] = target_new;
  }

  // History: old ReplicaSets with no pods, oldest first, beyond the limit.
  const int64_t limit = num(d, "/spec/revisionHistoryLimit"_json_pointer, 10);
  std::vector<std::string> empty;
  for (const json* o : olds) {
    if (replicasOf(*o) == 0 && num(*o, "/status/replicas"_json_pointer) == 0) empty.push_back(k8s::objectName(*o));
  }
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(limit, 0)) < empty.size(); ++i) {
    plan.remove.push_back(empty[i]);
  }

  // Status, from what the ReplicaSets report.
  int total = 0, ready = 0, available = 0;
  for (const json& rs : replicaSets) {
    if (deleting(rs)) continue;
    total += static_cast<int>(num(rs, "/status/replicas"_json_pointer));
    ready += static_cast<int>(num(rs, "/status/readyReplicas"_json_pointer));
    available += static_cast<int>(num(rs, "/status/availableReplicas"_json_pointer));
  }
  const int updated = current ? static_cast<int>(num(*current, "/status/replicas"_json_pointer)) : 0;
  const json previous_status = d.value("status", json::object());
  const json previous = previous_status.value("conditions", json::array());
  const std::string rs_name = strCat(name, "-", hash);
  const bool complete = current && updated == replicas && total == replicas && available >= replicas &&
                        replicasOf(*current) == replicas && old_total == 0;
  const bool progressed = plan.create.has_value() || !plan.scale.empty() ||
                          previous_status.value("replicas", -1) != total ||
                          previous_status.value("updatedReplicas", -1) != updated ||
                          previous_status.value("availableReplicas", -1) != available ||
                          previous_status.value("readyReplicas", -1) != ready;
  json progressing;
  if (complete) {
    progressing = condition("Progressing", true, "NewReplicaSetAvailable",
                            strCat("ReplicaSet \"", rs_name, "\" has successfully progressed."), previous, now, progressed);
  } else {
    std::string last_update = now;
    bool exceeded = false;
    for (const auto& p : previous) {
      if (p.value("type", "") != "Progressing") continue;
      last_update = p.value("lastUpdateTime", now);
      exceeded = p.value("reason", "") == "ProgressDeadlineExceeded";
    }
    WallTime since{};
    const int64_t deadline = num(d, "/spec/progressDeadlineSeconds"_json_pointer, 600);
    if (!progressed && (exceeded || (k8s::parseTime(last_update, &since) &&
                                     now_time - since > std::chrono::seconds(deadline)))) {
      progressing = condition("Progressing", false, "ProgressDeadlineExceeded",
                              strCat("ReplicaSet \"", rs_name, "\" has timed out progressing."), previous, now, false);
    } else {
      progressing = condition("Progressing", true, plan.create ? "NewReplicaSetCreated" : "ReplicaSetUpdated",
                              strCat("ReplicaSet \"", rs_name, "\" is progressing."), previous, now, progressed);
    }
  }
  const bool min_available = available >= replicas - unavailable;
  json availableCond = condition("Available", min_available,
                                 min_available ? "MinimumReplicasAvailable" : "MinimumReplicasUnavailable",
                                 min_available ? "Deployment has minimum availability."
                                               : "Deployment does not have minimum availability.",
                                 previous, now, false);
  plan.status = {{"observedGeneration", num(d, "/metadata/generation"_json_pointer, 1)},
                 {"replicas", total},
                 {"updatedReplicas", updated},
                 {"readyReplicas", ready},
                 {"availableReplicas", available},
                 {"unavailableReplicas", std::max(0, total - available)},
                 {"conditions", json::array({availableCond, progressing})}};
  return plan;
}

std::optional<json> planEndpointSlice(const json& service, const std::vector<json>& pods) {
  const json selector = service.value("/spec/selector"_json_pointer, json::object());
  if (!selector.is_object() || selector.empty()) return std::nullopt;
  const std::string name = k8s::objectName(service);
  json endpoints = json::array();
  std::vector<const json*> selected;
  for (const json& p : pods) {
    if (!selectorMatches({{"matchLabels", selector}}, p.value("/metadata/labels"_json_pointer, json::object()))) continue;
    const std::string ip = str(p, "/status/podIP"_json_pointer);
    const std::string phase = str(p, "/status/phase"_json_pointer);
    if (ip.empty() || phase == "Succeeded" || phase == "Failed") continue;
    selected.push_back(&p);
    const bool terminating = deleting(p);
    json e = {{"addresses", {ip}},
              {"conditions", {{"ready", podReady(p) && !terminating}, {"serving", podReady(p)}, {"terminating", terminating}}},
              {"targetRef",
               {{"kind", "Pod"}, {"name", k8s::objectName(p)}, {"namespace", k8s::objectNamespace(p)}, {"uid", k8s::objectUid(p)}}}};
    const std::string node = str(p, "/spec/nodeName"_json_pointer);
    if (!node.empty()) e["nodeName"] = node;
    endpoints.push_back(std::move(e));
  }
  std::sort(endpoints.begin(), endpoints.end(),
            [](const json& a, const json& b) { return a["targetRef"]["name"] < b["targetRef"]["name"]; });
  json ports = json::array();
  for (const auto& sp : service.value("/spec/ports"_json_pointer, json::array())) {
    const json target = sp.value("targetPort", sp.value("port", json(0)));
    int port = target.is_number_integer() ? target.get<int>() : 0;
    if (target.is_string()) {
      // A named port: the first selected pod's container port of that name.
      for (const json* p : selected) {
        for (const auto& c : p->value("/spec/containers"_json_pointer, json::array())) {
          for (const auto& cp : c.value("ports", json::array())) {
            if (port == 0 && cp.value("name", "") == target.get<std::string>()) port = cp.value("containerPort", 0);
          }
        }
      }
      if (port == 0) {  // a number written as a string
        const std::string text = target.get<std::string>();
        char* end = nullptr;
        const long n = std::strtol(text.c_str(), &end, 10);
        if (!text.empty() && *end == '\0') port = static_cast<int>(n);
      }
    }
    json pj = {{"port", port}, {"protocol", sp.value("protocol", "TCP")}};
    pj["name"] = sp.value("name", "");
    ports.push_back(std::move(pj));
  }
  const std::string suffix = nameHash(name, 5);
  return json{{"apiVersion", "discovery.k8s.io/v1"},
              {"kind", "EndpointSlice"},
              {"metadata",
               {{"name", strCat(name, "-", suffix)},
                {"namespace", k8s::objectNamespace(service)},
                {"labels",
                 {{"kubernetes.io/service-name", name},
                  {"endpointslice.kubernetes.io/managed-by", "endpointslice-controller.k8s.io"}}},
                {"ownerReferences", json::array({controllerRef(service, "v1", "Service")})}}},
              {"addressType", "IPv4"},
              {"endpoints", endpoints},
              {"ports", ports}};
}

}  // namespace tandem::kubelet
