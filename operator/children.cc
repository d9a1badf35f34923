#include "operator/children.h"

#include <xxhash.h>

#include <cstdio>

#include "src/common/strings.h"

namespace tandem::op {
namespace {

using nlohmann::json;

constexpr const char* kApiVersion = "serving.tandem.dev/v1alpha1";
constexpr const char* kConfigPath = "/etc/tandem";
constexpr const char* kModelMount = "/model";
constexpr const char* kRoutingPath = "/etc/tandem-routing";
constexpr const char* kPoolKeyPath = "/var/run/tandem/pool-key";
constexpr const char* kApiKeysPath = "/var/run/tandem/api-keys";
constexpr int kAgentUid = 65532;     // the image's non-root user (Dockerfile)
constexpr int kSecretFileMode = 0440;  // owner and group (fsGroup) read

json labels(const PoolSpec& pool, const Role* role) {
  json l = {{"app.kubernetes.io/name", "tandem"},
            {"app.kubernetes.io/instance", pool.name},
            {"app.kubernetes.io/managed-by", "tandem-operator"}};
  if (role != nullptr) l["serving.tandem.dev/role"] = roleName(*role);
  return l;
}

json metadata(const PoolSpec& pool, const std::string& name, const Role* role) {
  return {{"name", name},
          {"namespace", pool.ns},
          {"labels", labels(pool, role)},
          {"ownerReferences", json::array({{{"apiVersion", kApiVersion},
                                            {"kind", "InferencePool"},
                                            {"name", pool.name},
                                            {"uid", pool.uid},
                                            {"controller", true},
                                            {"blockOwnerDeletion", true}}})}};
}

json object(const char* api_version, const char* kind, json md) {
  return {{"apiVersion", api_version}, {"kind", kind}, {"metadata", std::move(md)}};
}

std::string agentName(const PoolSpec& pool) { return strCat(pool.name, "-agent"); }

// "sl=1,tc=96" for an annotation; "" when neither is set.
std::string trafficClassText(const TrafficClass& t) {
  std::string out;
  if (t.infiniband_service_level) out += strCat("sl=", *t.infiniband_service_level);
  if (t.traffic_class) out += strCat(out.empty() ? "" : ",", "tc=", *t.traffic_class);
  return out;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The role's command line: the shared config, the role, where it listens,
// how it finds its peers, the router's policy knobs, then the user's args.
// Whether a role's agents split the model across the pod's GPUs (one
// tensor-parallel rank per GPU): several GPUs, and no --device of the
// role's own args that keeps it off them (`--device cpu` on a GPU node).
bool splitsAcrossGpus(const PoolSpec& pool, Role role) {
  const RoleSpec& r = pool.role(role);
  if (role == Role::kRouter || r.gpus_per_pod <= 1) return false;
  std::string device = "cuda";
  for (size_t i = 0; i < r.args.size(); ++i) {
    if (r.args[i] == "--device" && i + 1 < r.args.size()) device = r.args[i + 1];
    if (r.args[i].rfind("--device=", 0) == 0) device = r.args[i].substr(9);
  }
  return device == "cuda";
}

json args(const PoolSpec& pool, Role role) {
  json a = json::array({"--config", strCat(kConfigPath, "/agent.yaml"), "--role", roleName(role), "--pool-key-dir",
                        kPoolKeyPath});
  const int port = role == Role::kRouter ? kRouterPort : kAgentPort;
  a.push_back("--listen");
  a.push_back(strCat("0.0.0.0:", port));
  if (role != Role::kRouter) {
    a.push_back("--kv-listen");
    a.push_back(strCat("$(POD_IP):", kKvPort));
  }
  if (role == Role::kDecode) {
    a.push_back("--prefill-service");
    a.push_back(childName(pool, Role::kPrefill));
    a.push_back("--drain-grace");
    a.push_back("80s");
  } else {
    a.push_back("--drain-grace");
    a.push_back("20s");
  }
  if (role == Role::kRouter) {
    a.push_back("--decode-service");
    a.push_back(childName(pool, Role::kDecode));
    a.push_back("--prefill-service");
    a.push_back(childName(pool, Role::kPrefill));
    // The planner's knobs (operator/autoscaler.h), when it publishes them.
    a.push_back("--routing-knobs");
    a.push_back(strCat(kRoutingPath, "/knobs.json"));
    // spec.router.policy, in a fixed order: camelCase knob -> --route-<kebab-case>.
    for (const auto& [knob, flag] : {std::pair{"overlapWeight", "--route-overlap-weight"},
                                     std::pair{"stickyWeight", "--route-sticky-weight"},
                                     std::pair{"loadFloorWeight", "--route-load-floor-weight"},
                                     std::pair{"queuePenalty", "--route-queue-penalty"},
                                     std::pair{"directMaxSuffix", "--route-direct-max-suffix"},
                                     std::pair{"prefillOverloadTokens", "--route-prefill-overload-tokens"}}) {
      auto it = pool.router_policy.find(knob);
      if (it == pool.router_policy.end() || !it->is_number()) continue;
      a.push_back(flag);
      a.push_back(it->is_number_integer() ? std::to_string(it->get<int64_t>()) : it->dump());
    }
  }
  // Every role checks the keys: a client that reaches an agent's port
  // directly needs one too (a router's requests bear the pool's token).
  if (!pool.api_keys_secret.empty()) {
    a.push_back("--api-keys-file");
    a.push_back(strCat(kApiKeysPath, "/keys.yaml"));
  }
  // A role given GPUs serves on them (the image's agent has the CUDA
  // backend; docs/cuda.md), the model split across all of them (one
  // tensor-parallel rank per GPU); the user's args come after and can
  // override either.
  if (role != Role::kRouter && pool.role(role).gpus_per_pod > 0) {
    a.push_back("--device");
    a.push_back("cuda");
    if (splitsAcrossGpus(pool, role)) {
      a.push_back("--tensor-parallel");
      a.push_back(std::to_string(pool.role(role).gpus_per_pod));
    }
  }
  for (const std::string& extra : pool.role(role).args) a.push_back(extra);
  return a;
}

json env(const PoolSpec& pool, Role role) {
  json e = json::array({{{"name", "POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}},
                        {{"name", "POD_NAMESPACE"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.namespace"}}}}}}});
  auto add = [&](const char* name, const std::optional<int32_t>& v) {
    if (v) e.push_back({{"name", name}, {"value", std::to_string(*v)}});
  };
  if (role != Role::kRouter) {
    // KV transfers (UCX) on their lane; the model's collectives (NCCL) on theirs.
    add("UCX_IB_SL", pool.kv_traffic.infiniband_service_level);
    add("UCX_IB_TRAFFIC_CLASS", pool.kv_traffic.traffic_class);
    add("NCCL_IB_SL", pool.collective_traffic.infiniband_service_level);
    add("NCCL_IB_TC", pool.collective_traffic.traffic_class);
  }
  for (const json& user : pool.role(role).env) e.push_back(user);
  return e;
}

json resources(const PoolSpec& pool, Role role) {
  const RoleSpec& r = pool.role(role);
  json res = r.resources;
  if (!res.is_object()) res = json::object();
  if (r.gpus_per_pod > 0) {
    res["limits"]["nvidia.com/gpu"] = r.gpus_per_pod;
    res["requests"]["nvidia.com/gpu"] = r.gpus_per_pod;
  }
  if (role != Role::kRouter && !pool.rdma_resource.empty()) {
    res["limits"][pool.rdma_resource] = pool.rdma_count;
    res["requests"][pool.rdma_resource] = pool.rdma_count;
  }
  return res;
}

json deployment(const PoolSpec& pool, Role role, const std::string& config_hash) {
  const RoleSpec& r = pool.role(role);
  const int port = role == Role::kRouter ? kRouterPort : kAgentPort;
  json ports = json::array({{{"name", "http"}, {"containerPort", port}, {"protocol", "TCP"}}});
  if (role != Role::kRouter) ports.push_back({{"name", "kv"}, {"containerPort", kKvPort}, {"protocol", "TCP"}});
  json container = {
      {"name", role == Role::kRouter ? "router" : "agent"},
      {"image", r.image.empty() ? pool.image : r.image},
      {"command", json::array({"tandem-agent"})},
      {"args", args(pool, role)},
      {"env", env(pool, role)},
      {"ports", ports},
      {"readinessProbe",
       {{"httpGet", {{"path", "/readyz"}, {"port", "http"}}}, {"periodSeconds", 2}, {"timeoutSeconds", 3}}},
      // Lenient: an agent busy enough to answer slowly must not be killed
      // (a decode agent takes its resident sessions with it); a hung one
      // goes within a minute.
      {"livenessProbe",
       {{"httpGet", {{"path", "/healthz"}, {"port", "http"}}},
        {"periodSeconds", 10},
        {"timeoutSeconds", 5},
        {"failureThreshold", 6}}},
      {"volumeMounts", json::array({{{"name", "config"}, {"mountPath", kConfigPath}, {"readOnly", true}},
                                    {{"name", "model"}, {"mountPath", kModelMount}, {"readOnly", true}},
                                    {{"name", "pool-key"}, {"mountPath", kPoolKeyPath}, {"readOnly", true}}})}};
  if (role == Role::kRouter) {
    container["volumeMounts"].push_back({{"name", "routing"}, {"mountPath", kRoutingPath}, {"readOnly", true}});
  }
  if (!pool.api_keys_secret.empty()) {
    container["volumeMounts"].push_back({{"name", "api-keys"}, {"mountPath", kApiKeysPath}, {"readOnly", true}});
  }
  // A tensor-parallel group (several GPUs) meets over a socket in /dev/shm,
  // and NCCL keeps its shared memory there: memory-backed, not the
  // runtime's small default.
  const bool tensor_parallel = splitsAcrossGpus(pool, role);
  if (tensor_parallel) container["volumeMounts"].push_back({{"name", "dshm"}, {"mountPath", "/dev/shm"}});
  if (json res = resources(pool, role); !res.empty()) container["resources"] = res;
  // Hardened: nothing to write (the agent writes no file unless given
  // --trace-file; UCX's shared memory is under /dev/shm, which the runtime
  // mounts writable), nothing to gain by escalating, no capability but
  // IPC_LOCK for RDMA's pinned memory where asked.
  json capabilities = {{"drop", json::array({"ALL"})}};
  if (pool.ipc_lock && role != Role::kRouter) capabilities["add"] = json::array({"IPC_LOCK"});
  container["securityContext"] = {{"allowPrivilegeEscalation", false},
                                  {"readOnlyRootFilesystem", true},
                                  {"capabilities", capabilities}};
  json model_volume = pool.model_pvc.empty()
                          ? json{{"name", "model"}, {"hostPath", {{"path", pool.model_path}, {"type", "Directory"}}}}
                          : json{{"name", "model"},
                                 {"persistentVolumeClaim", {{"claimName", pool.model_pvc}, {"readOnly", true}}}};
  json pod_spec = {
      {"serviceAccountName", agentName(pool)},
      // The agent drains on SIGTERM within --drain-grace; the grace leaves it that.
      {"terminationGracePeriodSeconds", role == Role::kDecode ? 90 : 30},
      {"securityContext",
       {{"runAsNonRoot", true},
        {"runAsUser", kAgentUid},
        {"runAsGroup", kAgentUid},
        {"fsGroup", kAgentUid},
        {"seccompProfile", {{"type", "RuntimeDefault"}}}}},
      {"containers", json::array({container})},
      {"volumes", json::array({{{"name", "config"}, {"configMap", {{"name", agentName(pool)}}}},
                               model_volume,
                               // Not through subPath: a mounted Secret's files are replaced when
                               // it is edited (a rotation), a subPath's never.
                               {{"name", "pool-key"},
                                {"secret", {{"secretName", poolKeySecretName(pool)}, {"defaultMode", kSecretFileMode}}}}})}};
  if (role == Role::kRouter) {
    // Optional: it exists only while the planner sizes the pool.
    pod_spec["volumes"].push_back(
        {{"name", "routing"}, {"configMap", {{"name", strCat(pool.name, "-routing")}, {"optional", true}}}});
  }
  if (!pool.api_keys_secret.empty()) {
    pod_spec["volumes"].push_back(
        {{"name", "api-keys"}, {"secret", {{"secretName", pool.api_keys_secret}, {"defaultMode", kSecretFileMode}}}});
  }
  if (tensor_parallel) pod_spec["volumes"].push_back({{"name", "dshm"}, {"emptyDir", {{"medium", "Memory"}}}});
  if (!r.node_selector.empty()) pod_spec["nodeSelector"] = r.node_selector;
  if (!r.tolerations.empty()) pod_spec["tolerations"] = r.tolerations;
  if (r.affinity.is_object()) pod_spec["affinity"] = r.affinity;

  // The usual scrape annotations: Prometheus' kubernetes_sd relabelling
  // (and the local cluster's scrape targets) find the agents by them.
  json annotations = {{"serving.tandem.dev/config-hash", config_hash},
                      {"prometheus.io/scrape", "true"},
                      {"prometheus.io/port", std::to_string(port)}};
  if (role != Role::kRouter) {
    if (std::string kv = trafficClassText(pool.kv_traffic); !kv.empty()) {
      annotations["serving.tandem.dev/kv-traffic-class"] = kv;
    }
    if (std::string coll = trafficClassText(pool.collective_traffic); !coll.empty()) {
      annotations["serving.tandem.dev/collective-traffic-class"] = coll;
    }
    if (!pool.attachments.empty()) {
      std::string list;
      for (const std::string& a : pool.attachments) list += strCat(list.empty() ? "" : ",", a);
      annotations["k8s.v1.cni.cncf.io/networks"] = list;
    }
  }
  json d = object("apps/v1", "Deployment", metadata(pool, childName(pool, role), &role));
  d["spec"] = {{"replicas", r.replicas},
               {"selector", {{"matchLabels", roleSelector(pool, role)}}},
               {"template", {{"metadata", {{"labels", labels(pool, &role)}, {"annotations", annotations}}},
                             {"spec", pod_spec}}}};
  return d;
}

json headlessService(const PoolSpec& pool, Role role) {
  json s = object("v1", "Service", metadata(pool, childName(pool, role), &role));
  s["spec"] = {{"clusterIP", "None"},
               {"selector", roleSelector(pool, role)},
               {"ports", json::array({{{"name", "http"}, {"port", kAgentPort}, {"targetPort", "http"}, {"protocol", "TCP"}},
                                      {{"name", "kv"}, {"port", kKvPort}, {"targetPort", "kv"}, {"protocol", "TCP"}}})}};
  return s;
}

}  // namespace

json roleSelector(const PoolSpec& pool, Role role) {
  return {{"app.kubernetes.io/instance", pool.name}, {"serving.tandem.dev/role", roleName(role)}};
}

std::string agentConfigYaml(const PoolSpec& pool) {
  // Only what every role shares; each role's flags are on its command line.
  std::string y = strCat("# Rendered by tandem-operator from InferencePool ", pool.ns, "/", pool.name,
                         "; edits are overwritten.\npool: ", json(pool.name).dump(), "\nmodel:\n  dir: ", kModelMount,
                         "\n  name: ", json(pool.model_name).dump(), "\n");
  if (!pool.model_fingerprint.empty()) y += strCat("  fingerprint: ", json(pool.model_fingerprint).dump(), "\n");
  y += strCat("engine:\n  block_size: ", pool.block_size, "\n  num_blocks: ", pool.num_blocks,
              "\n  max_batched_tokens: ", pool.max_batched_tokens, "\n");
  // The dtypes only when not the default: a pool that does not use them
  // keeps the agent.yaml (and config hash) it had before they existed, so
  // an operator upgrade restarts none of its pods, and an older agent
  // image (which refuses keys it does not know) still reads it.
  if (pool.dtype != "float32") y += strCat("  dtype: ", pool.dtype, "\n");
  if (pool.kv_dtype != "float32") y += strCat("  kv_dtype: ", pool.kv_dtype, "\n");
  if (pool.max_num_seqs) y += strCat("  max_num_seqs: ", *pool.max_num_seqs, "\n");
  if (pool.max_model_len) y += strCat("  max_model_len: ", *pool.max_model_len, "\n");
  if (!pool.kv_cache_memory.empty()) y += strCat("  kv_cache_bytes: ", json(pool.kv_cache_memory).dump(), "\n");
  if (pool.kv_device_transport != "auto") y += strCat("kv:\n  device_transport: ", pool.kv_device_transport, "\n");
  return y;
}

std::string poolKeySecretName(const PoolSpec& pool) { return strCat(pool.name, "-pool-key"); }

json poolKeySecret(const PoolSpec& pool, const std::string& key) {
  json md = metadata(pool, poolKeySecretName(pool), nullptr);
  md["annotations"] = {{"serving.tandem.dev/rotation",
                        "add next-key, then move key to previous-key and next-key to key, then drop previous-key, "
                        "waiting for the pods to see each step (docs/security.md)"}};
  json s = object("v1", "Secret", std::move(md));
  s["type"] = "Opaque";
  s["stringData"] = {{"key", key}};
  return s;
}

std::vector<const json*> Children::all() const {
  return {&service_account, &role,           &role_binding,   &config_map,     &prefill_service,
          &decode_service,  &router_service, &deployments[0], &deployments[1], &deployments[2]};
}

Children desiredChildren(const PoolSpec& pool) {
  Children c;
  const std::string config = agentConfigYaml(pool);
  const std::string config_hash = hex64(XXH3_64bits(config.data(), config.size()));

  c.config_map = object("v1", "ConfigMap", metadata(pool, agentName(pool), nullptr));
  c.config_map["data"] = {{"agent.yaml", config}};
  c.service_account = object("v1", "ServiceAccount", metadata(pool, agentName(pool), nullptr));
  const std::string discovery = strCat(pool.name, "-discovery");
  c.role = object("rbac.authorization.k8s.io/v1", "Role", metadata(pool, discovery, nullptr));
  c.role["rules"] = json::array({{{"apiGroups", json::array({"discovery.k8s.io"})},
                                  {"resources", json::array({"endpointslices"})},
                                  {"verbs", json::array({"get", "list", "watch"})}}});
  c.role_binding = object("rbac.authorization.k8s.io/v1", "RoleBinding", metadata(pool, discovery, nullptr));
  c.role_binding["roleRef"] = {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "Role"}, {"name", discovery}};
  c.role_binding["subjects"] =
      json::array({{{"kind", "ServiceAccount"}, {"name", agentName(pool)}, {"namespace", pool.ns}}});

  const Role router = Role::kRouter;
  c.router_service = object("v1", "Service", metadata(pool, pool.name, &router));
  c.router_service["spec"] = {
      {"type", "ClusterIP"},
      {"selector", roleSelector(pool, Role::kRouter)},
      {"ports", json::array({{{"name", "http"}, {"port", kRouterPort}, {"targetPort", "http"}, {"protocol", "TCP"}}})}};
  c.prefill_service = headlessService(pool, Role::kPrefill);
  c.decode_service = headlessService(pool, Role::kDecode);
  for (Role r : kRoles) c.deployments[static_cast<int>(r)] = deployment(pool, r, config_hash);
  return c;
}

}  // namespace tandem::op
