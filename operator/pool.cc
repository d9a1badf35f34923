#include "operator/pool.h"

#include <algorithm>

#include "src/common/config.h"
#include "src/common/status.h"
#include "src/common/strings.h"

namespace tandem::op {
namespace {

using nlohmann::json;

absl::Status fieldError(const std::string& path, std::string_view why) {
  return absl::InvalidArgumentError(strCat(path, ": ", why));
}

const json& member(const json& j, const char* key) {
  static const json null;
  if (!j.is_object()) return null;
  auto it = j.find(key);
  return it == j.end() ? null : *it;
}

// A DNS-1123 subdomain: what Kubernetes accepts as a Secret's name.
bool isDnsSubdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(s.front()) || !alnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return alnum(c) || c == '-' || c == '.'; });
}

absl::StatusOr<std::string> str(const json& j, const char* key, const std::string& path, std::string fallback = "") {
  const json& v = member(j, key);
  if (v.is_null()) return fallback;
  if (!v.is_string()) return fieldError(strCat(path, ".", key), "expected a string");
  return v.get<std::string>();
}

absl::StatusOr<int32_t> integer(const json& j, const char* key, const std::string& path, int32_t fallback,
                                int64_t min, int64_t max) {
  const json& v = member(j, key);
  if (v.is_null()) return fallback;
  if (!v.is_number_integer()) return fieldError(strCat(path, ".", key), "expected an integer");
  const int64_t n = v.get<int64_t>();
  if (n < min || n > max) return fieldError(strCat(path, ".", key), strCat("must be between ", min, " and ", max));
  return static_cast<int32_t>(n);
}

absl::StatusOr<std::optional<int32_t>> optInteger(const json& j, const char* key, const std::string& path, int64_t min,
                                                  int64_t max) {
  if (member(j, key).is_null()) return std::optional<int32_t>();
  TANDEM_ASSIGN_OR_RETURN(int32_t n, integer(j, key, path, 0, min, max));
  return std::optional<int32_t>(n);
}

absl::StatusOr<bool> boolean(const json& j, const char* key, const std::string& path, bool fallback) {
  const json& v = member(j, key);
  if (v.is_null()) return fallback;
  if (!v.is_boolean()) return fieldError(strCat(path, ".", key), "expected true or false");
  return v.get<bool>();
}

absl::StatusOr<json> object(const json& j, const char* key, const std::string& path) {
  const json& v = member(j, key);
  if (v.is_null()) return json::object();
  if (!v.is_object()) return fieldError(strCat(path, ".", key), "expected an object");
  return v;
}

absl::StatusOr<json> list(const json& j, const char* key, const std::string& path) {
  const json& v = member(j, key);
  if (v.is_null()) return json::array();
  if (!v.is_array()) return fieldError(strCat(path, ".", key), "expected a list");
  return v;
}

absl::Status parseRole(const json& j, const std::string& path, bool gpus, RoleSpec& r) {
  if (!j.is_null() && !j.is_object()) return fieldError(path, "expected an object");
  TANDEM_ASSIGN_OR_RETURN(r.replicas, integer(j, "replicas", path, r.replicas, 0, 1000));
  if (gpus) {
    TANDEM_ASSIGN_OR_RETURN(r.gpus_per_pod, integer(j, "gpusPerPod", path, 0, 0, 64));
  }
  TANDEM_ASSIGN_OR_RETURN(r.resources, object(j, "resources", path));
  TANDEM_ASSIGN_OR_RETURN(r.node_selector, object(j, "nodeSelector", path));
  for (const auto& [k, v] : r.node_selector.items()) {
    if (!v.is_string()) return fieldError(strCat(path, ".nodeSelector[\"", k, "\"]"), "expected a string");
  }
  TANDEM_ASSIGN_OR_RETURN(r.tolerations, list(j, "tolerations", path));
  r.affinity = member(j, "affinity");
  if (!r.affinity.is_null() && !r.affinity.is_object()) return fieldError(strCat(path, ".affinity"), "expected an object");
  TANDEM_ASSIGN_OR_RETURN(r.image, str(j, "image", path));
  TANDEM_ASSIGN_OR_RETURN(json args, list(j, "args", path));
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].is_string()) return fieldError(strCat(path, ".args[", i, "]"), "expected a string");
    r.args.push_back(args[i].get<std::string>());
  }
  TANDEM_ASSIGN_OR_RETURN(r.env, list(j, "env", path));
  for (size_t i = 0; i < r.env.size(); ++i) {
    if (!r.env[i].is_object() || !member(r.env[i], "name").is_string()) {
      return fieldError(strCat(path, ".env[", i, "]"), "expected an object with a name");
    }
  }
  // A GPU count belongs to gpusPerPod: two places for one number would disagree.
  for (const char* section : {"requests", "limits"}) {
    if (member(member(r.resources, section), "nvidia.com/gpu").is_null()) continue;
    return fieldError(strCat(path, ".resources.", section, "[\"nvidia.com/gpu\"]"), "set GPUs with gpusPerPod instead");
  }
  return absl::OkStatus();
}

absl::Status parseTrafficClass(const json& j, const std::string& path, TrafficClass& t) {
  if (!j.is_null() && !j.is_object()) return fieldError(path, "expected an object");
  TANDEM_ASSIGN_OR_RETURN(t.infiniband_service_level, optInteger(j, "infinibandServiceLevel", path, 0, 15));
  TANDEM_ASSIGN_OR_RETURN(t.traffic_class, optInteger(j, "trafficClass", path, 0, 255));
  return absl::OkStatus();
}

bool isDns1035Label(std::string_view s) {
  if (s.empty() || s.size() > 63 || !(s[0] >= 'a' && s[0] <= 'z') || s.back() == '-') return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

absl::StatusOr<double> number(const json& j, const char* key, const std::string& path, double fallback, double min,
                              double max) {
  const json& v = member(j, key);
  if (v.is_null()) return fallback;
  if (!v.is_number()) return fieldError(strCat(path, ".", key), "expected a number");
  const double n = v.get<double>();
  if (!(n >= min && n <= max)) return fieldError(strCat(path, ".", key), strCat("must be between ", min, " and ", max));
  return n;
}

// A duration such as "30s" or "5m", in seconds, at least `min_s`.
absl::StatusOr<double> duration(const json& j, const char* key, const std::string& path, double fallback,
                                double min_s) {
  const json& v = member(j, key);
  if (v.is_null()) return fallback;
  if (!v.is_string()) return fieldError(strCat(path, ".", key), "expected a duration such as \"30s\"");
  absl::StatusOr<std::chrono::nanoseconds> d = parseDuration(v.get<std::string>());
  if (!d.ok()) return fieldError(strCat(path, ".", key), toStd(d.status().message()));
  const double s = std::chrono::duration<double>(*d).count();
  if (s < min_s) return fieldError(strCat(path, ".", key), strCat("must be at least ", min_s, "s"));
  return s;
}

absl::Status parseAutoscaling(const json& a, AutoscalingSpec& out) {
  if (!a.is_null() && !a.is_object()) return fieldError("spec.autoscaling", "expected an object");
  const std::string path = "spec.autoscaling";
  TANDEM_ASSIGN_OR_RETURN(out.enabled, boolean(a, "enabled", path, false));
  TANDEM_ASSIGN_OR_RETURN(out.prometheus_url, str(a, "prometheusUrl", path));
  if (!out.prometheus_url.empty() && !out.prometheus_url.starts_with("http://") &&
      !out.prometheus_url.starts_with("https://")) {
    return fieldError("spec.autoscaling.prometheusUrl", "expected an http:// or https:// URL");
  }
  TANDEM_ASSIGN_OR_RETURN(out.interval_s, duration(a, "interval", path, out.interval_s, 1));
  TANDEM_ASSIGN_OR_RETURN(out.ttft_target_s, number(a, "ttftP95TargetSeconds", path, out.ttft_target_s, 1e-6, 3600));
  TANDEM_ASSIGN_OR_RETURN(out.tpot_target_s, number(a, "tpotP95TargetSeconds", path, out.tpot_target_s, 1e-6, 60));
  TANDEM_ASSIGN_OR_RETURN(out.min_free_kv_ratio, number(a, "minFreeKvRatio", path, out.min_free_kv_ratio, 0, 0.99));
  for (const char* role : {"prefill", "decode"}) {
    const json& b = member(a, role);
    if (!b.is_null() && !b.is_object()) return fieldError(strCat(path, ".", role), "expected an object");
    const bool prefill = std::string_view(role) == "prefill";
    const std::string bpath = strCat(path, ".", role);
    int32_t& lo = prefill ? out.prefill_min : out.decode_min;
    int32_t& hi = prefill ? out.prefill_max : out.decode_max;
    // At least 1: a role with no replica exports no metrics to grow it back from.
    TANDEM_ASSIGN_OR_RETURN(lo, integer(b, "min", bpath, lo, 1, 1000));
    TANDEM_ASSIGN_OR_RETURN(hi, integer(b, "max", bpath, hi, 0, 1000));
    if (lo > hi) return fieldError(bpath, strCat("min (", lo, ") must not exceed max (", hi, ")"));
  }
  TANDEM_ASSIGN_OR_RETURN(int32_t budget, integer(a, "gpuBudget", path, 0, 0, 1000000));
  out.gpu_budget = budget;
  TANDEM_ASSIGN_OR_RETURN(out.scale_up_cooldown_s, duration(a, "scaleUpCooldown", path, out.scale_up_cooldown_s, 0));
  TANDEM_ASSIGN_OR_RETURN(out.scale_down_cooldown_s,
                          duration(a, "scaleDownCooldown", path, out.scale_down_cooldown_s, 0));
  TANDEM_ASSIGN_OR_RETURN(out.warmup_s, duration(a, "warmup", path, out.warmup_s, 0));
  if (!member(a, "scaleUpCheck").is_null()) {
    TANDEM_ASSIGN_OR_RETURN(double every, duration(a, "scaleUpCheck", path, 0, 0));
    if (every > 0 && every < 1) {
      // Each check runs the pool's Prometheus queries; the loop looks once a second.
      return fieldError("spec.autoscaling.scaleUpCheck", "must be 0s (checks only at intervals) or at least 1s");
    }
    if (every > out.interval_s) {
      return fieldError("spec.autoscaling.scaleUpCheck",
                        strCat("must not exceed the interval (", out.interval_s, "s); 0s checks only at intervals"));
    }
    out.scale_up_check_s = every;
  }
  return absl::OkStatus();
}

}  // namespace

const char* roleName(Role role) {
  switch (role) {
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
    case Role::kRouter:
      return "router";
  }
  return "?";
}

std::string childName(const PoolSpec& pool, Role role) { return strCat(pool.name, "-", roleName(role)); }

absl::StatusOr<PoolSpec> parsePool(const json& pool) {
  PoolSpec p;
  const json& md = member(pool, "metadata");
  TANDEM_ASSIGN_OR_RETURN(p.name, str(md, "name", "metadata"));
  TANDEM_ASSIGN_OR_RETURN(p.ns, str(md, "namespace", "metadata", "default"));
  TANDEM_ASSIGN_OR_RETURN(p.uid, str(md, "uid", "metadata"));
  if (const json& g = member(md, "generation"); g.is_number_integer()) p.generation = g.get<int64_t>();
  // Its pods are <pool>-decode-<10>-<5>: 40 characters leave that a DNS label.
  if (!isDns1035Label(p.name) || p.name.size() > 40) {
    return fieldError("metadata.name",
                      strCat("\"", p.name, "\" must be a DNS-1035 label of at most 40 characters (its children's names "
                                       "add a role and two hashes)"));
  }
  const json& spec = member(pool, "spec");
  if (!spec.is_object()) return fieldError("spec", "required");
  const json& model = member(spec, "model");
  if (!model.is_object()) return fieldError("spec.model", "required");
  TANDEM_ASSIGN_OR_RETURN(p.model_name, str(model, "name", "spec.model"));
  if (p.model_name.empty()) return fieldError("spec.model.name", "required");
  TANDEM_ASSIGN_OR_RETURN(p.model_path, str(model, "path", "spec.model"));
  TANDEM_ASSIGN_OR_RETURN(p.model_pvc, str(model, "pvc", "spec.model"));
  if (!p.model_path.empty() && !p.model_pvc.empty()) return fieldError("spec.model", "give path or pvc, not both");
  if (!p.model_path.empty() && p.model_path[0] != '/') {
    return fieldError("spec.model.path", strCat("\"", p.model_path, "\" must be an absolute path on the node"));
  }
  if (p.model_path.empty() && p.model_pvc.empty()) p.model_path = strCat("/models/", p.model_name);
  TANDEM_ASSIGN_OR_RETURN(p.model_fingerprint, str(model, "fingerprint", "spec.model"));
  TANDEM_ASSIGN_OR_RETURN(p.image, str(spec, "image", "spec", p.image));
  if (p.image.empty()) return fieldError("spec.image", "must not be empty");

  const json& engine = member(spec, "engine");
  TANDEM_ASSIGN_OR_RETURN(p.block_size, integer(engine, "blockSize", "spec.engine", p.block_size, 1, 1024));
  TANDEM_ASSIGN_OR_RETURN(p.num_blocks, integer(engine, "numBlocks", "spec.engine", p.num_blocks, 1, 16777216));
  TANDEM_ASSIGN_OR_RETURN(p.max_batched_tokens,
                          integer(engine, "maxBatchedTokens", "spec.engine", p.max_batched_tokens, 1, 1048576));
  TANDEM_ASSIGN_OR_RETURN(p.max_num_seqs, optInteger(engine, "maxNumSeqs", "spec.engine", 1, 65536));
  TANDEM_ASSIGN_OR_RETURN(p.max_model_len, optInteger(engine, "maxModelLen", "spec.engine", 1, 16777216));
  TANDEM_ASSIGN_OR_RETURN(p.dtype, str(engine, "dtype", "spec.engine", p.dtype));
  if (p.dtype != "float32" && p.dtype != "bfloat16") {
    return fieldError("spec.engine.dtype", strCat("\"", p.dtype, "\" is not one of: float32, bfloat16"));
  }
  TANDEM_ASSIGN_OR_RETURN(p.kv_dtype, str(engine, "kvDtype", "spec.engine", p.kv_dtype));
  if (p.kv_dtype != "float32" && p.kv_dtype != "bfloat16") {
    return fieldError("spec.engine.kvDtype", strCat("\"", p.kv_dtype, "\" is not one of: float32, bfloat16"));
  }
  TANDEM_ASSIGN_OR_RETURN(p.kv_cache_memory, str(engine, "kvCacheMemory", "spec.engine", p.kv_cache_memory));
  if (!p.kv_cache_memory.empty() && !parseByteSize(p.kv_cache_memory)) {
    return fieldError("spec.engine.kvCacheMemory",
                      strCat("\"", p.kv_cache_memory, "\" is not a size such as 40Gi, 512Mi or 2G"));
  }

  TANDEM_RETURN_IF_ERROR(parseRole(member(spec, "prefill"), "spec.prefill", true, p.prefill));
  TANDEM_RETURN_IF_ERROR(parseRole(member(spec, "decode"), "spec.decode", true, p.decode));
  TANDEM_RETURN_IF_ERROR(parseRole(member(spec, "router"), "spec.router", false, p.router));
  TANDEM_ASSIGN_OR_RETURN(p.router_policy, object(member(spec, "router"), "policy", "spec.router"));
  TANDEM_ASSIGN_OR_RETURN(p.api_keys_secret, str(member(spec, "router"), "apiKeysSecret", "spec.router"));
  if (!p.api_keys_secret.empty() && !isDnsSubdomain(p.api_keys_secret)) {
    return fieldError("spec.router.apiKeysSecret",
                      strCat("\"", p.api_keys_secret, "\" is not a Secret name (lower-case letters, digits, '-' and '.')"));
  }

  TANDEM_RETURN_IF_ERROR(parseAutoscaling(member(spec, "autoscaling"), p.autoscaling));
  if (p.autoscaling.enabled &&
      (p.prefill.replicas > p.autoscaling.prefill_max || p.decode.replicas > p.autoscaling.decode_max)) {
    return fieldError("spec.autoscaling", "replicas must be within the autoscaling bounds when autoscaling is enabled");
  }
  const json& net = member(spec, "network");
  TANDEM_RETURN_IF_ERROR(parseTrafficClass(member(net, "kvTrafficClass"), "spec.network.kvTrafficClass", p.kv_traffic));
  TANDEM_RETURN_IF_ERROR(parseTrafficClass(member(net, "collectiveTrafficClass"), "spec.network.collectiveTrafficClass",
                                           p.collective_traffic));
  if (const json& rdma = member(net, "rdmaResource"); !rdma.is_null()) {
    if (!rdma.is_object()) return fieldError("spec.network.rdmaResource", "expected an object");
    TANDEM_ASSIGN_OR_RETURN(p.rdma_resource, str(rdma, "name", "spec.network.rdmaResource"));
    if (p.rdma_resource.empty()) return fieldError("spec.network.rdmaResource.name", "required");
    TANDEM_ASSIGN_OR_RETURN(p.rdma_count, integer(rdma, "count", "spec.network.rdmaResource", 1, 1, 64));
  }
  TANDEM_ASSIGN_OR_RETURN(json attachments, list(net, "attachments", "spec.network"));
  for (size_t i = 0; i < attachments.size(); ++i) {
    if (!attachments[i].is_string() || attachments[i].get<std::string>().empty()) {
      return fieldError(strCat("spec.network.attachments[", i, "]"), "expected a network attachment's name");
    }
    p.attachments.push_back(attachments[i].get<std::string>());
  }
  TANDEM_ASSIGN_OR_RETURN(p.ipc_lock, boolean(net, "ipcLock", "spec.network", false));
  TANDEM_ASSIGN_OR_RETURN(p.kv_device_transport, str(net, "kvDeviceTransport", "spec.network", p.kv_device_transport));
  if (p.kv_device_transport != "auto" && p.kv_device_transport != "staged" && p.kv_device_transport != "direct") {
    return fieldError("spec.network.kvDeviceTransport",
                      strCat("\"", p.kv_device_transport, "\" is not one of: auto, staged, direct"));
  }
  if (p.kv_device_transport == "direct") {
    // Direct needs each agent's pool in GPU memory, one process per pod.
    for (const auto& [name, r] : {std::pair{"prefill", &p.prefill}, std::pair{"decode", &p.decode}}) {
      if (r->gpus_per_pod != 1) {
        return fieldError("spec.network.kvDeviceTransport",
                          strCat("direct needs spec.", name, ".gpusPerPod 1 (a KV pool in one GPU's memory; with ",
                                 "more, a tensor-parallel group's peers read a staging copy), got ", r->gpus_per_pod,
                                 ": use auto or staged"));
      }
    }
  }
  return p;
}

}  // namespace tandem::op
