#pragma once
// What an InferencePool should consist of (docs/operator.md "Children"):
// every object the operator server-side-applies for a pool, computed from
// its spec alone. Deterministic (the same spec gives byte-identical
// objects), so the reconciler can apply them every time and converge.
//
//   <pool>-agent           ConfigMap (agent.yaml: model and engine) and ServiceAccount
//   <pool>-discovery       Role (get/list/watch EndpointSlices) and RoleBinding
//   <pool>                 Service, ClusterIP, port http 8000 -> the routers
//   <pool>-prefill/-decode headless Services, ports http 8100 and kv 8200
//   <pool>-prefill/-decode/-router  Deployments
//
// Every object carries the labels app.kubernetes.io/name=tandem,
// app.kubernetes.io/instance=<pool>, app.kubernetes.io/managed-by=
// tandem-operator (and serving.tandem.dev/role where it has one) and a
// controller owner reference to the pool. Pods carry the KV and collective
// traffic classes as annotations (serving.tandem.dev/kv-traffic-class,
// .../collective-traffic-class) and environment (UCX_IB_SL,
// UCX_IB_TRAFFIC_CLASS; NCCL_IB_SL, NCCL_IB_TC), Multus attachments
// (k8s.v1.cni.cncf.io/networks), the RDMA resource, IPC_LOCK when asked,
// and serving.tandem.dev/config-hash so a changed agent.yaml rolls them.
// Replicas are not in the pod template: scaling one role restarts nothing.
//
// Every pod mounts the pool key's Secret (<pool>-pool-key, poolKeySecret();
// the reconciler creates it once with a random key, docs/security.md) at
// /var/run/tandem/pool-key, and the Secret of spec.router.apiKeysSecret at
// /var/run/tandem/api-keys (every role checks client keys: the routers'
// requests to agents bear the pool's token instead). Pods run as
// non-root (uid 65532) with a read-only root filesystem, no privilege
// escalation, the runtime's seccomp profile and no capabilities but
// IPC_LOCK where spec.network.ipcLock asks for it (RDMA).
//
// Pure.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/pool.h"

namespace tandem::op {

inline constexpr int kRouterPort = 8000;
inline constexpr int kAgentPort = 8100;
inline constexpr int kKvPort = 8200;

struct Children {
  nlohmann::json config_map, service_account, role, role_binding;
  nlohmann::json router_service, prefill_service, decode_service;
  nlohmann::json deployments[3];  // by Role: prefill, decode, router

  // In the order they are applied: what others need first.
  std::vector<const nlohmann::json*> all() const;
};

Children desiredChildren(const PoolSpec& pool);

// The pool key's Secret: "<pool>-pool-key" holding `key` (what
// src/auth/pool_key.h reads). Created once by the reconciler with a fresh
// random key and never applied again, so a user's rotation stands.
std::string poolKeySecretName(const PoolSpec& pool);
nlohmann::json poolKeySecret(const PoolSpec& pool, const std::string& key);

// The labels selecting a role's pods (the Deployment's selector).
nlohmann::json roleSelector(const PoolSpec& pool, Role role);
// The agent configuration every pod reads (the ConfigMap's agent.yaml).
std::string agentConfigYaml(const PoolSpec& pool);

}  // namespace tandem::op
