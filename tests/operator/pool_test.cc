// An InferencePool's spec as the operator reads it (operator/pool.h):
// defaults where fields are absent, and each check a schema cannot make
// named by its path.

#include "operator/pool.h"

#include <gtest/gtest.h>

#include "operator/children.h"

namespace tandem::op {
namespace {

using nlohmann::json;

json minimalPool() {
  return json::parse(R"({"apiVersion": "serving.tandem.dev/v1alpha1", "kind": "InferencePool",
    "metadata": {"name": "tiny", "namespace": "serving", "uid": "u-1", "generation": 3},
    "spec": {"model": {"name": "tiny"}}})");
}

TEST(PoolTest, AbsentFieldsTakeTheSchemasDefaults) {
  auto p = parsePool(minimalPool());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "tiny");
  EXPECT_EQ(p->ns, "serving");
  EXPECT_EQ(p->generation, 3);
  EXPECT_EQ(p->model_path, "/models/tiny");
  EXPECT_EQ(p->prefill.replicas, 1);
  EXPECT_EQ(p->decode.replicas, 2);
  EXPECT_EQ(p->router.replicas, 1);
  EXPECT_EQ(p->block_size, 16);
  EXPECT_EQ(p->num_blocks, 512);
  EXPECT_EQ(p->dtype, "float32");
  EXPECT_EQ(p->kv_dtype, "float32");
  // The defaults are not written: agent.yaml stays what it was before they existed.
  EXPECT_EQ(agentConfigYaml(*p).find("dtype"), std::string::npos) << agentConfigYaml(*p);
  EXPECT_EQ(agentConfigYaml(*p).find("kv_cache_bytes"), std::string::npos) << agentConfigYaml(*p);
  EXPECT_EQ(p->kv_device_transport, "auto");
  EXPECT_EQ(agentConfigYaml(*p).find("kv:"), std::string::npos) << agentConfigYaml(*p);
  EXPECT_FALSE(p->autoscaling.enabled);
  EXPECT_TRUE(p->kv_traffic.empty());
  EXPECT_EQ(childName(*p, Role::kDecode), "tiny-decode");
}

TEST(PoolTest, EveryFieldIsRead) {
  json pool = minimalPool();
  pool["spec"] = json::parse(R"({
    "model": {"name": "llama", "pvc": "models", "fingerprint": "0123456789abcdef"},
    "image": "registry.example/tandem:1.0",
    "engine": {"blockSize": 32, "numBlocks": 4096, "maxBatchedTokens": 8192, "maxNumSeqs": 128, "maxModelLen": 131072,
               "dtype": "bfloat16", "kvDtype": "bfloat16", "kvCacheMemory": "40Gi"},
    "prefill": {"replicas": 2, "gpusPerPod": 8, "nodeSelector": {"pool": "h100"}, "args": ["--kv-tls", "rc,cuda_copy"]},
    "decode": {"replicas": 4, "gpusPerPod": 8, "tolerations": [{"key": "gpu", "operator": "Exists"}]},
    "router": {"replicas": 2, "policy": {"stickyWeight": 2.5}},
    "autoscaling": {"enabled": true},
    "network": {"kvTrafficClass": {"infinibandServiceLevel": 1, "trafficClass": 96},
                "collectiveTrafficClass": {"infinibandServiceLevel": 0, "trafficClass": 104},
                "rdmaResource": {"name": "rdma/ib", "count": 1}, "attachments": ["sriov-ib0"], "ipcLock": true}
  })");
  auto p = parsePool(pool);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->model_pvc, "models");
  EXPECT_TRUE(p->model_path.empty());
  EXPECT_EQ(p->max_model_len, 131072);
  EXPECT_EQ(p->dtype, "bfloat16");
  EXPECT_NE(agentConfigYaml(*p).find("\n  dtype: bfloat16\n"), std::string::npos) << agentConfigYaml(*p);
  EXPECT_EQ(p->kv_dtype, "bfloat16");
  EXPECT_NE(agentConfigYaml(*p).find("\n  kv_dtype: bfloat16\n"), std::string::npos) << agentConfigYaml(*p);
  EXPECT_NE(agentConfigYaml(*p).find("\n  kv_cache_bytes: \"40Gi\"\n"), std::string::npos) << agentConfigYaml(*p);
  EXPECT_EQ(p->prefill.gpus_per_pod, 8);
  EXPECT_EQ(p->prefill.args, (std::vector<std::string>{"--kv-tls", "rc,cuda_copy"}));
  EXPECT_EQ(p->decode.replicas, 4);
  EXPECT_EQ(p->router_policy["stickyWeight"], 2.5);
  EXPECT_TRUE(p->autoscaling.enabled);
  EXPECT_EQ(p->kv_traffic.infiniband_service_level, 1);
  EXPECT_EQ(p->collective_traffic.traffic_class, 104);
  EXPECT_EQ(p->rdma_resource, "rdma/ib");
  EXPECT_EQ(p->attachments, std::vector<std::string>{"sriov-ib0"});
  EXPECT_TRUE(p->ipc_lock);
}

// spec.network.kvDeviceTransport reaches every agent's kv.device_transport;
// direct needs prefill and decode pods of one GPU each, and says so.
TEST(PoolTest, KvDeviceTransportIsRenderedAndDirectNeedsOneGpuPerPod) {
  json pool = minimalPool();
  pool["spec"]["network"] = {{"kvDeviceTransport", "direct"}};
  pool["spec"]["prefill"] = {{"gpusPerPod", 1}};
  pool["spec"]["decode"] = {{"gpusPerPod", 1}};
  auto p = parsePool(pool);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kv_device_transport, "direct");
  EXPECT_NE(agentConfigYaml(*p).find("\nkv:\n  device_transport: direct\n"), std::string::npos) << agentConfigYaml(*p);
  pool["spec"]["network"]["kvDeviceTransport"] = "staged";
  pool["spec"]["decode"]["gpusPerPod"] = 8;
  p = parsePool(pool);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NE(agentConfigYaml(*p).find("\nkv:\n  device_transport: staged\n"), std::string::npos) << agentConfigYaml(*p);
  pool["spec"]["network"]["kvDeviceTransport"] = "direct";
  EXPECT_EQ(parsePool(pool).status().message(),
            "spec.network.kvDeviceTransport: direct needs spec.decode.gpusPerPod 1 (a KV pool in one GPU's memory; "
            "with more, a tensor-parallel group's peers read a staging copy), got 8: use auto or staged");
  pool["spec"]["prefill"]["gpusPerPod"] = 0;
  EXPECT_NE(parsePool(pool).status().message().find("direct needs spec.prefill.gpusPerPod 1"), std::string::npos);
  pool["spec"]["network"]["kvDeviceTransport"] = "gpudirect";
  EXPECT_EQ(parsePool(pool).status().message(),
            "spec.network.kvDeviceTransport: \"gpudirect\" is not one of: auto, staged, direct");
}

TEST(PoolTest, WhatASchemaCannotCatchIsNamedByItsPath) {
  auto msg = [](const char* path, json value) {
    json pool = minimalPool();
    pool[json::json_pointer(path)] = std::move(value);
    return std::string(parsePool(pool).status().message());
  };
  EXPECT_EQ(msg("/metadata/name", "a-very-long-pool-name-that-leaves-no-room-for-pods"),
            "metadata.name: \"a-very-long-pool-name-that-leaves-no-room-for-pods\" must be a DNS-1035 label of at "
            "most 40 characters (its children's names add a role and two hashes)");
  EXPECT_EQ(msg("/metadata/name", "9lives"), "metadata.name: \"9lives\" must be a DNS-1035 label of at most 40 "
                                             "characters (its children's names add a role and two hashes)");
  EXPECT_EQ(msg("/spec/model", json::object()), "spec.model.name: required");
  EXPECT_EQ(msg("/spec/engine/dtype", "float16"), "spec.engine.dtype: \"float16\" is not one of: float32, bfloat16");
  EXPECT_EQ(msg("/spec/engine/dtype", 16), "spec.engine.dtype: expected a string");
  EXPECT_EQ(msg("/spec/engine/kvDtype", "fp8"), "spec.engine.kvDtype: \"fp8\" is not one of: float32, bfloat16");
  EXPECT_EQ(msg("/spec/engine/kvDtype", true), "spec.engine.kvDtype: expected a string");
  EXPECT_EQ(msg("/spec/engine/kvCacheMemory", "40 gigs"),
            "spec.engine.kvCacheMemory: \"40 gigs\" is not a size such as 40Gi, 512Mi or 2G");
  EXPECT_EQ(msg("/spec/model/path", "models/tiny"), "spec.model.path: \"models/tiny\" must be an absolute path on the node");
  EXPECT_EQ(msg("/spec/model", json{{"name", "tiny"}, {"path", "/m"}, {"pvc", "m"}}), "spec.model: give path or pvc, not both");
  EXPECT_EQ(msg("/spec/decode/replicas", -1), "spec.decode.replicas: must be between 0 and 1000");
  EXPECT_EQ(msg("/spec/decode/resources", json::parse(R"({"limits": {"nvidia.com/gpu": 1}})")),
            "spec.decode.resources.limits[\"nvidia.com/gpu\"]: set GPUs with gpusPerPod instead");
  EXPECT_EQ(msg("/spec/network/kvTrafficClass", json{{"infinibandServiceLevel", 16}}),
            "spec.network.kvTrafficClass.infinibandServiceLevel: must be between 0 and 15");
  EXPECT_EQ(msg("/spec/network/collectiveTrafficClass", json{{"trafficClass", 300}}),
            "spec.network.collectiveTrafficClass.trafficClass: must be between 0 and 255");
  EXPECT_EQ(msg("/spec/prefill/args", json::array({1})), "spec.prefill.args[0]: expected a string");
  EXPECT_EQ(msg("/spec/router/env", json::array({json::object()})), "spec.router.env[0]: expected an object with a name");
  EXPECT_EQ(msg("/spec/network/attachments", json::array({""})),
            "spec.network.attachments[0]: expected a network attachment's name");
  EXPECT_EQ(std::string(parsePool(json{{"metadata", {{"name", "x"}}}}).status().message()), "spec: required");
  EXPECT_EQ(msg("/spec/router/apiKeysSecret", "Team_Keys"),
            "spec.router.apiKeysSecret: \"Team_Keys\" is not a Secret name (lower-case letters, digits, '-' and '.')");
  EXPECT_EQ(msg("/spec/router/apiKeysSecret", 7), "spec.router.apiKeysSecret: expected a string");
  {
    json pool = minimalPool();
    pool["spec"]["router"]["apiKeysSecret"] = "team-keys.v2";
    auto p = parsePool(pool);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->api_keys_secret, "team-keys.v2");
  }
  // spec.autoscaling
  EXPECT_EQ(msg("/spec/autoscaling/interval", "soon"),
            "spec.autoscaling.interval: expected a duration like 250ms, 30s, 5m or 1h, got \"soon\"");
  EXPECT_EQ(msg("/spec/autoscaling/interval", "100ms"), "spec.autoscaling.interval: must be at least 1s");
  EXPECT_EQ(msg("/spec/autoscaling/scaleUpCheck", "45s"),
            "spec.autoscaling.scaleUpCheck: must not exceed the interval (30s); 0s checks only at intervals");
  EXPECT_EQ(msg("/spec/autoscaling/scaleUpCheck", "500ms"),
            "spec.autoscaling.scaleUpCheck: must be 0s (checks only at intervals) or at least 1s");
  EXPECT_EQ(msg("/spec/autoscaling/scaleUpCheck", 10), "spec.autoscaling.scaleUpCheck: expected a duration such as \"30s\"");
  EXPECT_EQ(msg("/spec/autoscaling/scaleDownCooldown", 300), "spec.autoscaling.scaleDownCooldown: expected a duration such as \"30s\"");
  EXPECT_EQ(msg("/spec/autoscaling/ttftP95TargetSeconds", 0), "spec.autoscaling.ttftP95TargetSeconds: must be between 1e-06 and 3600");
  EXPECT_EQ(msg("/spec/autoscaling/minFreeKvRatio", 1), "spec.autoscaling.minFreeKvRatio: must be between 0 and 0.99");
  EXPECT_EQ(msg("/spec/autoscaling/decode", json{{"min", 4}, {"max", 2}}),
            "spec.autoscaling.decode: min (4) must not exceed max (2)");
  EXPECT_EQ(msg("/spec/autoscaling/prometheusUrl", "prometheus:9090"),
            "spec.autoscaling.prometheusUrl: expected an http:// or https:// URL");
  EXPECT_EQ(msg("/spec/autoscaling", json{{"enabled", true}, {"decode", {{"min", 1}, {"max", 1}}}}),
            "spec.autoscaling: replicas must be within the autoscaling bounds when autoscaling is enabled");
  EXPECT_EQ(msg("/spec/autoscaling/prefill", json{{"min", 0}}), "spec.autoscaling.prefill.min: must be between 1 and 1000");
}

TEST(PoolTest, AutoscalingDefaultsAndValues) {
  json pool = minimalPool();
  auto p = parsePool(pool);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->autoscaling.enabled);
  EXPECT_DOUBLE_EQ(p->autoscaling.interval_s, 30);
  EXPECT_DOUBLE_EQ(p->autoscaling.scale_down_cooldown_s, 450);
  EXPECT_DOUBLE_EQ(p->autoscaling.scale_up_cooldown_s, 0);
  EXPECT_FALSE(p->autoscaling.scale_up_check_s) << "unset: a third of the interval";
  pool["spec"]["autoscaling"] = json::parse(R"({"enabled": true, "prometheusUrl": "http://prom:9090",
      "interval": "15s", "ttftP95TargetSeconds": 2, "tpotP95TargetSeconds": 0.04, "minFreeKvRatio": 0.2,
      "prefill": {"min": 1, "max": 4}, "decode": {"min": 2, "max": 8}, "gpuBudget": 12,
      "scaleUpCooldown": "30s", "scaleDownCooldown": "2m", "scaleUpCheck": "5s"})");
  p = parsePool(pool);
  ASSERT_TRUE(p.ok()) << p.status();
  const AutoscalingSpec& a = p->autoscaling;
  EXPECT_TRUE(a.enabled);
  EXPECT_EQ(a.prometheus_url, "http://prom:9090");
  EXPECT_DOUBLE_EQ(a.interval_s, 15);
  EXPECT_DOUBLE_EQ(a.ttft_target_s, 2);
  EXPECT_DOUBLE_EQ(a.tpot_target_s, 0.04);
  EXPECT_DOUBLE_EQ(a.min_free_kv_ratio, 0.2);
  EXPECT_EQ(a.prefill_max, 4);
  EXPECT_EQ(a.decode_min, 2);
  EXPECT_EQ(a.gpu_budget, 12);
  EXPECT_DOUBLE_EQ(a.scale_up_cooldown_s, 30);
  EXPECT_DOUBLE_EQ(a.scale_down_cooldown_s, 120);
  EXPECT_EQ(a.scale_up_check_s, 5);
  pool["spec"]["autoscaling"]["scaleUpCheck"] = "0s";
  p = parsePool(pool);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->autoscaling.scale_up_check_s, 0) << "0s: checks only at intervals";
}

}  // namespace
}  // namespace tandem::op
