#include "e2e/kubelet/pod_spec.h"

#include <map>

#include <nlohmann/json.hpp>

#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::kubelet {
namespace {

using nlohmann::json;

absl::Status fieldError(const std::string& path, std::string_view why) {
  return absl::InvalidArgumentError(strCat(path, ": ", why));
}

// The string at `j[key]`; "" when absent; an error when not a string.
absl::StatusOr<std::string> optString(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::string();
  if (!it->is_string()) return fieldError(strCat(path, ".", key), "expected a string");
  return it->get<std::string>();
}

// A list of strings (command, args).
absl::StatusOr<std::vector<std::string>> stringList(const json& j, const char* key, const std::string& path) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_array()) return fieldError(strCat(path, ".", key), "expected a list of strings");
  for (size_t i = 0; i < it->size(); ++i) {
    if (!(*it)[i].is_string()) return fieldError(strCat(path, ".", key, "[", i, "]"), "expected a string");
    out.push_back((*it)[i].get<std::string>());
  }
  return out;
}

absl::StatusOr<int64_t> optInt(const json& j, const char* key, const std::string& path, int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) return fieldError(strCat(path, ".", key), "expected an integer");
  return it->get<int64_t>();
}

// An image whose repository (its last path component, without tag or
// digest) ends in "tandem".
bool localImage(std::string_view image) {
  std::string_view repo = image.substr(0, image.find('@'));
  const size_t slash = repo.rfind('/');
  const size_t colon = repo.rfind(':');
  if (colon != std::string_view::npos && (slash == std::string_view::npos || colon > slash)) repo = repo.substr(0, colon);
  if (slash != std::string_view::npos) repo = repo.substr(slash + 1);
  return repo.size() >= 6 && repo.substr(repo.size() - 6) == "tandem";
}

// Kubernetes' $(VAR) references in command, args and env values: replaced
// by the variable's value when it is defined, kept as written when not;
// $$ is a literal $.
std::string expandVariables(std::string_view text, const std::vector<std::pair<std::string, std::string>>& env) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$' || i + 1 >= text.size()) {
      out.push_back(text[i]);
      continue;
    }
    if (text[i + 1] == '$') {
      out.push_back('$');
      ++i;
      continue;
    }
    const size_t close = text[i + 1] == '(' ? text.find(')', i + 2) : std::string_view::npos;
    if (close == std::string_view::npos) {
      out.push_back('$');
      continue;
    }
    const std::string_view name = text.substr(i + 2, close - i - 2);
    const std::string* value = nullptr;
    for (const auto& [k, v] : env) {
      if (k == name) value = &v;  // the last definition wins
    }
    if (value != nullptr) {
      out += *value;
    } else {
      out += text.substr(i, close - i + 1);
    }
    i = close;
  }
  return out;
}

// The data of a ConfigMap or Secret the pod's environment names; nullopt
// when it is optional and missing.
absl::StatusOr<std::optional<std::map<std::string, std::string>>> readObjectData(std::string_view kind,
                                                                                 const std::string& name, bool optional,
                                                                                 const std::string& path,
                                                                                 const PodFacts& facts) {
  using Data = std::optional<std::map<std::string, std::string>>;
  if (!facts.lookup) return fieldError(path, strCat("this kubelet has no API access to read ", kind, " ", name));
  absl::StatusOr<std::map<std::string, std::string>> data = lookupData(facts, kind, name);
  if (!data.ok() && optional && absl::IsNotFound(data.status())) return Data();
  if (!data.ok()) return data.status();
  return Data(std::move(*data));
}

// A ConfigMap's or Secret's key for env valueFrom (configMapKeyRef,
// secretKeyRef); nullopt when it is optional and missing.
absl::StatusOr<std::optional<std::string>> keyRef(const json& ref, std::string_view kind, const std::string& path,
                                                  const PodFacts& facts) {
  if (!ref.is_object()) return fieldError(path, "expected an object");
  TANDEM_ASSIGN_OR_RETURN(std::string name, optString(ref, "name", path));
  TANDEM_ASSIGN_OR_RETURN(std::string key, optString(ref, "key", path));
  if (name.empty()) return fieldError(strCat(path, ".name"), "required");
  if (key.empty()) return fieldError(strCat(path, ".key"), "required");
  const bool optional = ref.value("optional", false);
  TANDEM_ASSIGN_OR_RETURN(auto data, readObjectData(kind, name, optional, path, facts));
  if (!data) return std::optional<std::string>();
  auto it = data->find(key);
  if (it == data->end()) {
    if (optional) return std::optional<std::string>();
    return absl::NotFoundError(strCat("couldn't find key ", key, " in ", kind, " ", facts.ns, "/", name));
  }
  return std::optional<std::string>(it->second);
}

absl::StatusOr<std::optional<std::string>> envValueFrom(const json& from, const std::string& path,
                                                        const PodFacts& facts) {
  if (auto cm = from.find("configMapKeyRef"); cm != from.end() && !cm->is_null()) {
    return keyRef(*cm, "ConfigMap", strCat(path, ".configMapKeyRef"), facts);
  }
  if (auto sec = from.find("secretKeyRef"); sec != from.end() && !sec->is_null()) {
    return keyRef(*sec, "Secret", strCat(path, ".secretKeyRef"), facts);
  }
  auto ref = from.find("fieldRef");
  if (ref == from.end() || !ref->is_object()) {
    return fieldError(path, "expected fieldRef, configMapKeyRef or secretKeyRef (resourceFieldRef is not supported here)");
  }
  TANDEM_ASSIGN_OR_RETURN(std::string field, optString(*ref, "fieldPath", strCat(path, ".fieldRef")));
  if (field == "metadata.name") return std::optional<std::string>(facts.name);
  if (field == "metadata.namespace") return std::optional<std::string>(facts.ns);
  if (field == "status.podIP") return std::optional<std::string>(facts.pod_ip);
  if (field == "spec.nodeName") return std::optional<std::string>(facts.node_name);
  return fieldError(strCat(path, ".fieldRef.fieldPath"),
                    strCat("\"", field, "\" is not one of metadata.name, metadata.namespace, status.podIP, spec.nodeName"));
}

// An httpGet action (probes, preStop): its path and port (a number or a container port's name).
absl::StatusOr<HttpProbe> httpGetAction(const json& c, const json& get, const std::string& p) {
  if (!get.is_object()) return fieldError(p, "expected an object");
  HttpProbe h;
  TANDEM_ASSIGN_OR_RETURN(h.path, optString(get, "path", p));
  if (h.path.empty()) h.path = "/";
  int64_t port = 0;
  if (auto named = get.find("port"); named != get.end() && named->is_string()) {
    // A container port's name (an IANA_SVC_NAME), as Kubernetes allows.
    for (const auto& cp : c.value("ports", json::array())) {
      if (cp.is_object() && cp.value("name", "") == named->get<std::string>()) port = cp.value("containerPort", 0);
    }
    if (port == 0) {
      return fieldError(strCat(p, ".port"), strCat("\"", named->get<std::string>(), "\" names none of the container's ports"));
    }
  } else {
    TANDEM_ASSIGN_OR_RETURN(port, optInt(get, "port", p, 0));
  }
  if (port < 1 || port > 65535) return fieldError(strCat(p, ".port"), "expected a port number 1-65535");
  h.port = static_cast<int>(port);
  return h;
}

absl::StatusOr<std::optional<HttpProbe>> probe(const json& c, const char* key, ProbeKind kind, const std::string& path) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return std::optional<HttpProbe>();
  const std::string p = strCat(path, ".", key);
  if (!it->is_object()) return fieldError(p, "expected an object");
  auto get = it->find("httpGet");
  if (get == it->end() || !get->is_object()) return fieldError(p, "only httpGet probes are supported here");
  TANDEM_ASSIGN_OR_RETURN(HttpProbe h, httpGetAction(c, *get, strCat(p, ".httpGet")));
  TANDEM_ASSIGN_OR_RETURN(int64_t delay, optInt(*it, "initialDelaySeconds", p, 0));
  TANDEM_ASSIGN_OR_RETURN(int64_t period, optInt(*it, "periodSeconds", p, 10));
  TANDEM_ASSIGN_OR_RETURN(int64_t timeout, optInt(*it, "timeoutSeconds", p, 1));
  TANDEM_ASSIGN_OR_RETURN(int64_t success, optInt(*it, "successThreshold", p, 1));
  TANDEM_ASSIGN_OR_RETURN(int64_t failure, optInt(*it, "failureThreshold", p, 3));
  for (auto [field, value] : {std::pair{"initialDelaySeconds", delay}, std::pair{"periodSeconds", period},
                              std::pair{"timeoutSeconds", timeout}, std::pair{"successThreshold", success},
                              std::pair{"failureThreshold", failure}}) {
    if (value > 86400) return fieldError(strCat(p, ".", field), "too large (at most 86400)");
  }
  h.spec = {.initial_delay = std::chrono::seconds(delay),
            .period = std::chrono::seconds(period),
            .timeout = std::chrono::seconds(timeout),
            .success_threshold = static_cast<int>(success),
            .failure_threshold = static_cast<int>(failure)};
  if (absl::Status s = validateProbe(kind, h.spec); !s.ok()) {
    return absl::InvalidArgumentError(strCat(path, ".", toStd(s.message())));  // "readinessProbe.periodSeconds: ..."
  }
  return std::optional<HttpProbe>(h);
}

// The container's resource requests added to `needs`.
absl::Status addRequests(const json& c, const std::string& path, PodNeeds& needs) {
  if (!c.is_object()) return fieldError(path, "expected an object");
  if (auto resources = c.find("resources"); resources != c.end() && !resources->is_null()) {
    if (!resources->is_object()) return fieldError(strCat(path, ".resources"), "expected an object");
    // As the API server defaults it: a resource given only a limit requests that much.
    json wanted = resources->value("limits", json::object());
    const json requests = resources->value("requests", json::object());
    if (!wanted.is_object() || !requests.is_object()) {
      return fieldError(strCat(path, ".resources"), "requests and limits must be objects");
    }
    for (const auto& [resource, quantity] : requests.items()) wanted[resource] = quantity;
    {
      for (const auto& [resource, quantity] : wanted.items()) {
        const std::string p = strCat(path, ".resources.requests[\"", resource, "\"]");
        std::string text = quantity.is_string() ? quantity.get<std::string>()
                           : quantity.is_number_integer() ? std::to_string(quantity.get<int64_t>())
                                                          : std::string("?");
        absl::StatusOr<int64_t> milli = parseQuantityMilli(text);
        if (!milli.ok()) return fieldError(p, toStd(milli.status().message()));
        int64_t& total = needs.requests[resource];
        if (*milli > INT64_MAX - total) return fieldError(p, "the pod's total is too large");
        total += *milli;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ContainerPlan> planContainer(const json& c, const std::string& path, const PodFacts& facts,
                                            const std::vector<VolumeSpec>& volumes) {
  if (!c.is_object()) return fieldError(path, "expected an object");
  ContainerPlan plan;
  TANDEM_ASSIGN_OR_RETURN(plan.name, optString(c, "name", path));
  TANDEM_ASSIGN_OR_RETURN(std::string image, optString(c, "image", path));
  if (!localImage(image)) {
    return fieldError(strCat(path, ".image"),
                      strCat("\"", image, "\": only images whose repository ends in \"tandem\" run here (the local build)"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> command, stringList(c, "command", path));
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> args, stringList(c, "args", path));
  if (command.empty()) return fieldError(strCat(path, ".command"), "required here (the local build has no image entrypoint)");
  if (command[0].find('/') == std::string::npos) command[0] = strCat(facts.bin_dir, "/", command[0]);
  // As Kubernetes sets it: the pod's name, at most a host name's 63 characters.
  plan.spec.env.emplace_back("HOSTNAME", facts.name.substr(0, 63));
  if (!facts.api_host.empty()) {
    // The API server's Service, as every pod on a real node sees it.
    plan.spec.env.emplace_back("KUBERNETES_SERVICE_HOST", facts.api_host);
    plan.spec.env.emplace_back("KUBERNETES_SERVICE_PORT", facts.api_port);
    plan.spec.env.emplace_back("KUBERNETES_SERVICE_PORT_HTTPS", facts.api_port);
    plan.spec.env.emplace_back("KUBERNETES_PORT", strCat("tcp://", facts.api_host, ":", facts.api_port));
  }
  // envFrom first; env entries override what it set.
  if (auto from = c.find("envFrom"); from != c.end() && !from->is_null()) {
    if (!from->is_array()) return fieldError(strCat(path, ".envFrom"), "expected a list");
    for (size_t i = 0; i < from->size(); ++i) {
      const std::string p = strCat(path, ".envFrom[", i, "]");
      const json& e = (*from)[i];
      if (!e.is_object()) return fieldError(p, "expected an object");
      TANDEM_ASSIGN_OR_RETURN(std::string prefix, optString(e, "prefix", p));
      const bool secret = e.contains("secretRef");
      const char* ref_key = secret ? "secretRef" : "configMapRef";
      auto ref = e.find(ref_key);
      if (ref == e.end() || !ref->is_object()) return fieldError(p, "expected configMapRef or secretRef");
      const std::string rp = strCat(p, ".", ref_key);
      TANDEM_ASSIGN_OR_RETURN(std::string name, optString(*ref, "name", rp));
      if (name.empty()) return fieldError(strCat(rp, ".name"), "required");
      TANDEM_ASSIGN_OR_RETURN(auto data, readObjectData(secret ? "Secret" : "ConfigMap", name,
                                                        ref->value("optional", false), rp, facts));
      if (!data) continue;
      for (const auto& [k, v] : *data) plan.spec.env.emplace_back(prefix + k, v);
    }
  }
  if (auto env = c.find("env"); env != c.end() && !env->is_null()) {
    if (!env->is_array()) return fieldError(strCat(path, ".env"), "expected a list");
    for (size_t i = 0; i < env->size(); ++i) {
      const std::string p = strCat(path, ".env[", i, "]");
      const json& e = (*env)[i];
      if (!e.is_object()) return fieldError(p, "expected an object");
      TANDEM_ASSIGN_OR_RETURN(std::string name, optString(e, "name", p));
      if (name.empty()) return fieldError(strCat(p, ".name"), "required");
      std::string value;
      if (auto from = e.find("valueFrom"); from != e.end() && !from->is_null()) {
        TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> v, envValueFrom(*from, strCat(p, ".valueFrom"), facts));
        if (!v) continue;  // an optional key that is not there: no variable
        value = std::move(*v);
      } else {
        TANDEM_ASSIGN_OR_RETURN(value, optString(e, "value", p));
        value = expandVariables(value, plan.spec.env);  // earlier variables only, as Kubernetes does
      }
      plan.spec.env.emplace_back(name, value);
    }
  }
  for (std::string& a : command) a = expandVariables(a, plan.spec.env);
  for (std::string& a : args) a = expandVariables(a, plan.spec.env);
  plan.spec.argv = command;
  plan.spec.argv.insert(plan.spec.argv.end(), args.begin(), args.end());
  if (auto lc = c.find("lifecycle"); lc != c.end() && !lc->is_null()) {
    const std::string p = strCat(path, ".lifecycle");
    if (!lc->is_object()) return fieldError(p, "expected an object");
    if (auto post = lc->find("postStart"); post != lc->end() && !post->is_null()) {
      return fieldError(strCat(p, ".postStart"), "not supported here");
    }
    if (auto pre = lc->find("preStop"); pre != lc->end() && !pre->is_null()) {
      auto get = pre->is_object() ? pre->find("httpGet") : pre->end();
      if (get == pre->end()) return fieldError(strCat(p, ".preStop"), "only httpGet hooks are supported here");
      TANDEM_ASSIGN_OR_RETURN(plan.pre_stop, httpGetAction(c, *get, strCat(p, ".preStop.httpGet")));
    }
  }
  for (const char* unsupported : {"startupProbe"}) {
    if (auto u = c.find(unsupported); u != c.end() && !u->is_null()) {
      return fieldError(strCat(path, ".", unsupported), "not supported here");
    }
  }
  if (auto ports = c.find("ports"); ports != c.end() && !ports->is_null()) {
    if (!ports->is_array()) return fieldError(strCat(path, ".ports"), "expected a list");
    for (size_t i = 0; i < ports->size(); ++i) {
      const std::string p = strCat(path, ".ports[", i, "]");
      TANDEM_ASSIGN_OR_RETURN(int64_t port, optInt((*ports)[i], "containerPort", p, 0));
      if (port < 1 || port > 65535) return fieldError(strCat(p, ".containerPort"), "expected a port number 1-65535");
      plan.ports.push_back(static_cast<int>(port));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(plan.mounts, planMounts(c, path, volumes));
  TANDEM_ASSIGN_OR_RETURN(plan.readiness, probe(c, "readinessProbe", ProbeKind::kReadiness, path));
  TANDEM_ASSIGN_OR_RETURN(plan.liveness, probe(c, "livenessProbe", ProbeKind::kLiveness, path));
  return plan;
}

}  // namespace

absl::StatusOr<PodNeeds> podNeeds(const nlohmann::json& pod) {
  auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return fieldError("spec", "required");
  PodNeeds needs;
  auto containers = spec->find("containers");
  if (containers == spec->end() || !containers->is_array() || containers->empty()) {
    return fieldError("spec.containers", "at least one container is required");
  }
  for (size_t i = 0; i < containers->size(); ++i) {
    TANDEM_RETURN_IF_ERROR(addRequests((*containers)[i], strCat("spec.containers[", i, "]"), needs));
  }
  if (auto sel = spec->find("nodeSelector"); sel != spec->end() && !sel->is_null()) {
    if (!sel->is_object()) return fieldError("spec.nodeSelector", "expected an object");
    for (const auto& [k, v] : sel->items()) {
      if (!v.is_string()) return fieldError(strCat("spec.nodeSelector[\"", k, "\"]"), "expected a string");
      needs.node_selector[k] = v.get<std::string>();
    }
  }
  if (auto tol = spec->find("tolerations"); tol != spec->end() && !tol->is_null()) {
    if (!tol->is_array()) return fieldError("spec.tolerations", "expected a list");
    for (size_t i = 0; i < tol->size(); ++i) {
      const std::string p = strCat("spec.tolerations[", i, "]");
      Toleration t;
      TANDEM_ASSIGN_OR_RETURN(t.key, optString((*tol)[i], "key", p));
      TANDEM_ASSIGN_OR_RETURN(std::string op, optString((*tol)[i], "operator", p));
      if (!op.empty()) t.op = op;
      if (t.op != "Equal" && t.op != "Exists") return fieldError(strCat(p, ".operator"), "expected Equal or Exists");
      TANDEM_ASSIGN_OR_RETURN(t.value, optString((*tol)[i], "value", p));
      TANDEM_ASSIGN_OR_RETURN(t.effect, optString((*tol)[i], "effect", p));
      needs.tolerations.push_back(std::move(t));
    }
  }
  return needs;
}

absl::StatusOr<PodPlan> planPod(const nlohmann::json& pod, const PodFacts& facts) {
  PodPlan plan;
  TANDEM_ASSIGN_OR_RETURN(plan.needs, podNeeds(pod));
  const json& spec = pod["spec"];
  for (const char* unsupported : {"initContainers", "affinity"}) {
    if (auto u = spec.find(unsupported); u != spec.end() && !u->is_null()) {
      return fieldError(strCat("spec.", unsupported), "not supported here yet");
    }
  }
  TANDEM_ASSIGN_OR_RETURN(plan.volumes, planVolumes(pod, facts));
  const json& containers = spec["containers"];
  for (size_t i = 0; i < containers.size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(ContainerPlan c,
                            planContainer(containers[i], strCat("spec.containers[", i, "]"), facts, plan.volumes));
    plan.containers.push_back(std::move(c));
  }
  TANDEM_ASSIGN_OR_RETURN(int64_t grace, optInt(spec, "terminationGracePeriodSeconds", "spec", 30));
  if (grace < 0 || grace > 86400) return fieldError("spec.terminationGracePeriodSeconds", "expected 0 to 86400");
  plan.grace = std::chrono::seconds(grace);
  return plan;
}

}  // namespace tandem::kubelet
