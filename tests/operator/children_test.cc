// The children an InferencePool should have (operator/children.h): names,
// labels and owner references, the agents' command lines and discovery,
// QoS on the pods, and a scale of one role touching nothing else.

#include "operator/children.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::op {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

PoolSpec pool() {
  auto p = parsePool(json::parse(R"({"metadata": {"name": "tiny", "namespace": "serving", "uid": "u-1"},
    "spec": {"model": {"name": "tiny", "path": "/srv/models/tiny"},
             "decode": {"args": ["--kv-tls", "posix,cma,tcp"]},
             "router": {"policy": {"stickyWeight": 2.5, "directMaxSuffix": 128}}}})"));
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

std::vector<std::string> strings(const json& j) { return j.get<std::vector<std::string>>(); }

TEST(ChildrenTest, NamesLabelsAndOwnerReferences) {
  const Children c = desiredChildren(pool());
  std::vector<std::string> names;
  for (const json* o : c.all()) {
    names.push_back((*o)["kind"].get<std::string>() + "/" + (*o)["metadata"]["name"].get<std::string>());
    EXPECT_EQ((*o)["metadata"]["namespace"], "serving");
    EXPECT_EQ((*o)["metadata"]["labels"]["app.kubernetes.io/instance"], "tiny");
    EXPECT_EQ((*o)["metadata"]["labels"]["app.kubernetes.io/managed-by"], "tandem-operator");
    const json& owner = (*o)["metadata"]["ownerReferences"][0];
    EXPECT_EQ(owner["kind"], "InferencePool");
    EXPECT_EQ(owner["uid"], "u-1");
    EXPECT_EQ(owner["controller"], true);
  }
  EXPECT_THAT(names, ::testing::ElementsAre("ServiceAccount/tiny-agent", "Role/tiny-discovery",
                                            "RoleBinding/tiny-discovery", "ConfigMap/tiny-agent",
                                            "Service/tiny-prefill", "Service/tiny-decode", "Service/tiny",
                                            "Deployment/tiny-prefill", "Deployment/tiny-decode",
                                            "Deployment/tiny-router"));
  EXPECT_EQ(c.prefill_service["spec"]["clusterIP"], "None");
  EXPECT_EQ(c.prefill_service["spec"]["ports"][1]["name"], "kv");
  EXPECT_EQ(c.router_service["spec"]["ports"][0]["port"], 8000);
  EXPECT_EQ(c.role["rules"][0]["resources"][0], "endpointslices");
  EXPECT_EQ(strings(c.role["rules"][0]["verbs"]), (std::vector<std::string>{"get", "list", "watch"}))
      << "read-only discovery";
}

TEST(ChildrenTest, AgentsFindEachOtherThroughTheHeadlessServices) {
  const Children c = desiredChildren(pool());
  const json& decode = c.deployments[static_cast<int>(Role::kDecode)];
  const json& router = c.deployments[static_cast<int>(Role::kRouter)];
  const json& dc = decode["spec"]["template"]["spec"]["containers"][0];
  EXPECT_THAT(strings(dc["args"]), ::testing::IsSupersetOf({"--prefill-service", "tiny-prefill", "--role", "decode"}));
  EXPECT_EQ(strings(dc["args"]).back(), "posix,cma,tcp") << "the role's own args come last";
  const json& rc = router["spec"]["template"]["spec"]["containers"][0];
  EXPECT_THAT(strings(rc["args"]), ::testing::IsSupersetOf({"--decode-service", "tiny-decode", "--prefill-service",
                                                            "tiny-prefill", "--route-sticky-weight", "2.5",
                                                            "--route-direct-max-suffix", "128"}));
  EXPECT_EQ(decode["spec"]["template"]["spec"]["serviceAccountName"], "tiny-agent");
  EXPECT_EQ(decode["spec"]["selector"]["matchLabels"], roleSelector(pool(), Role::kDecode));
  EXPECT_EQ(decode["spec"]["template"]["metadata"]["labels"]["serving.tandem.dev/role"], "decode");
  EXPECT_EQ(decode["spec"]["template"]["spec"]["volumes"][1]["hostPath"]["path"], "/srv/models/tiny");
  EXPECT_THAT(c.config_map["data"]["agent.yaml"].get<std::string>(), HasSubstr("dir: /model\n"));
  EXPECT_GT(decode["spec"]["template"]["spec"]["terminationGracePeriodSeconds"].get<int>(), 80)
      << "longer than the decode agent's --drain-grace";
}

TEST(ChildrenTest, QosGoesOnPrefillAndDecodePodsOnly) {
  PoolSpec p = pool();
  p.kv_traffic = {.infiniband_service_level = 1, .traffic_class = 96};
  p.collective_traffic = {.infiniband_service_level = 0, .traffic_class = 104};
  p.rdma_resource = "rdma/ib";
  p.attachments = {"sriov-ib0", "sriov-ib1"};
  p.ipc_lock = true;
  p.decode.gpus_per_pod = 8;
  const Children c = desiredChildren(p);
  const json& tmpl = c.deployments[static_cast<int>(Role::kDecode)]["spec"]["template"];
  EXPECT_EQ(tmpl["metadata"]["annotations"]["serving.tandem.dev/kv-traffic-class"], "sl=1,tc=96");
  EXPECT_EQ(tmpl["metadata"]["annotations"]["serving.tandem.dev/collective-traffic-class"], "sl=0,tc=104");
  EXPECT_EQ(tmpl["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"], "sriov-ib0,sriov-ib1");
  const json& container = tmpl["spec"]["containers"][0];
  std::map<std::string, std::string> env;
  for (const json& e : container["env"]) {
    if (e.contains("value")) env[e["name"]] = e["value"];
  }
  EXPECT_EQ(env["UCX_IB_SL"], "1");
  EXPECT_EQ(env["UCX_IB_TRAFFIC_CLASS"], "96");
  EXPECT_EQ(env["NCCL_IB_SL"], "0");
  EXPECT_EQ(env["NCCL_IB_TC"], "104");
  EXPECT_EQ(container["resources"]["limits"]["nvidia.com/gpu"], 8);
  EXPECT_EQ(container["resources"]["limits"]["rdma/ib"], 1);
  EXPECT_EQ(container["securityContext"]["capabilities"]["add"][0], "IPC_LOCK");
  const json& router = c.deployments[static_cast<int>(Role::kRouter)]["spec"]["template"];
  EXPECT_FALSE(router["metadata"]["annotations"].contains("serving.tandem.dev/kv-traffic-class"));
  EXPECT_FALSE(router["spec"]["containers"][0].contains("securityContext"));
}

TEST(ChildrenTest, ScalingOneRoleChangesOnlyItsReplicasAndAConfigChangeRollsEveryPod) {
  PoolSpec p = pool();
  const Children before = desiredChildren(p);
  EXPECT_EQ(desiredChildren(p).deployments[1].dump(), before.deployments[1].dump()) << "deterministic";
  p.decode.replicas = 3;
  const Children scaled = desiredChildren(p);
  EXPECT_EQ(scaled.deployments[1]["spec"]["replicas"], 3);
  EXPECT_EQ(scaled.deployments[1]["spec"]["template"], before.deployments[1]["spec"]["template"]);
  EXPECT_EQ(scaled.deployments[0].dump(), before.deployments[0].dump());
  EXPECT_EQ(scaled.deployments[2].dump(), before.deployments[2].dump());
  p.num_blocks = 1024;
  const Children reconfigured = desiredChildren(p);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(reconfigured.deployments[r]["spec"]["template"]["metadata"]["annotations"]["serving.tandem.dev/config-hash"],
              before.deployments[r]["spec"]["template"]["metadata"]["annotations"]["serving.tandem.dev/config-hash"]);
  }
}

}  // namespace
}  // namespace tandem::op
