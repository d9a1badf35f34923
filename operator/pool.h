#pragma once
// An InferencePool as the operator reads it (crds/inferencepool.yaml,
// docs/operator.md): the typed spec, with the API server's defaults where
// a field is absent (so a pool stored without them reads the same), and
// the checks a structural schema cannot make. Errors name the field by its
// path (spec.decode.replicas: ...); the reconciler reports them as the
// pool's Degraded condition.
//
// Pure.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace tandem::op {

enum class Role { kPrefill, kDecode, kRouter };
inline constexpr Role kRoles[] = {Role::kPrefill, Role::kDecode, Role::kRouter};
const char* roleName(Role role);  // "prefill", "decode", "router"

struct RoleSpec {
  int32_t replicas = 0;
  int32_t gpus_per_pod = 0;
  nlohmann::json resources = nlohmann::json::object();  // requests/limits as written
  nlohmann::json node_selector = nlohmann::json::object();
  nlohmann::json tolerations = nlohmann::json::array();
  nlohmann::json affinity;  // null when absent
  std::string image;        // "" : the pool's
  std::vector<std::string> args;
  nlohmann::json env = nlohmann::json::array();
};

struct TrafficClass {
  std::optional<int32_t> infiniband_service_level;  // 0-15
  std::optional<int32_t> traffic_class;             // 0-255
  bool empty() const { return !infiniband_service_level && !traffic_class; }
};

// spec.autoscaling (the planner's inputs; docs/planner.md).
struct AutoscalingSpec {
  bool enabled = false;
  std::string prometheus_url;  // "" : the operator's --prometheus-url
  double interval_s = 30;
  double ttft_target_s = 4, tpot_target_s = 0.05;
  double min_free_kv_ratio = 0.1;
  int32_t prefill_min = 1, prefill_max = 1000, decode_min = 1, decode_max = 1000;
  int64_t gpu_budget = 0;  // 0: none
  double scale_up_cooldown_s = 0, scale_down_cooldown_s = 450;
  double warmup_s = 60;
  // scaleUpCheck: growth checked this often between intervals; nullopt: a
  // third of the interval; 0: only at intervals.
  std::optional<double> scale_up_check_s;
  double scaleUpCheckSeconds() const { return scale_up_check_s.value_or(interval_s / 3); }
};

struct PoolSpec {
  // metadata
  std::string name, ns, uid;
  int64_t generation = 0;
  // spec.model
  std::string model_name;
  std::string model_path;  // hostPath on the node; default /models/<name>
  std::string model_pvc;   // instead of model_path
  std::string model_fingerprint;
  std::string image = "ghcr.io/tandem-serving/tandem:dev";
  // spec.engine
  int32_t block_size = 16, num_blocks = 512, max_batched_tokens = 512;
  std::optional<int32_t> max_num_seqs, max_model_len;
  std::string dtype = "float32";     // spec.engine.dtype: float32 | bfloat16 (the agents' --dtype)
  std::string kv_dtype = "float32";  // spec.engine.kvDtype: float32 | bfloat16 (the agents' --kv-dtype)
  std::string kv_cache_memory;  // spec.engine.kvCacheMemory: "40Gi" (the agents' --kv-cache-bytes); empty: numBlocks
  RoleSpec prefill{.replicas = 1}, decode{.replicas = 2}, router{.replicas = 1};
  nlohmann::json router_policy = nlohmann::json::object();  // spec.router.policy
  // spec.router.apiKeysSecret: a Secret in the pool's namespace whose
  // keys.yaml the routers check clients' API keys against (docs/api-keys.md);
  // "": no API keys.
  std::string api_keys_secret;
  AutoscalingSpec autoscaling;
  // spec.network
  TrafficClass kv_traffic, collective_traffic;
  std::string rdma_resource;  // "" : none
  int32_t rdma_count = 1;
  std::vector<std::string> attachments;
  bool ipc_lock = false;
  // spec.network.kvDeviceTransport: auto | staged | direct, how prefill and
  // decode agents' KV pools in GPU memory reach UCX (the agents'
  // --kv-device-transport; docs/cuda.md).
  std::string kv_device_transport = "auto";

  const RoleSpec& role(Role r) const { return r == Role::kPrefill ? prefill : r == Role::kDecode ? decode : router; }
};

// InvalidArgument naming the field for what is wrong.
absl::StatusOr<PoolSpec> parsePool(const nlohmann::json& pool);

// Child names: "<pool>-prefill", "<pool>-decode", "<pool>-router" (the
// Deployments, and the headless Services of prefill and decode); the router
// Service is "<pool>"; the agent ConfigMap and ServiceAccount
// "<pool>-agent"; the discovery Role and RoleBinding "<pool>-discovery".
std::string childName(const PoolSpec& pool, Role role);

}  // namespace tandem::op
