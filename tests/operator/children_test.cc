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
             "router": {"policy": {"stickyWeight": 2.5, "directMaxSuffix": 128, "prefillOverloadTokens": 20000}}}})"));
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
                                                            "--route-direct-max-suffix", "128",
                                                            "--route-prefill-overload-tokens", "20000"}));
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
  EXPECT_FALSE(router["spec"]["containers"][0]["securityContext"]["capabilities"].contains("add"))
      << "no IPC_LOCK for the router: it registers no memory";
}

// A role given GPUs serves on them: its agents get --device cuda (and with
// several GPUs --tensor-parallel, one rank per GPU) before the user's args
// (which can override them); a role without GPUs, and the router, keep the
// CPU backend.
TEST(ChildrenTest, ARoleWithGpusServesOnThem) {
  PoolSpec p = pool();
  p.prefill.gpus_per_pod = 1;
  p.decode.gpus_per_pod = 0;
  p.prefill.args = {"--device", "cpu"};
  const Children c = desiredChildren(p);
  auto args_of = [&](Role role) {
    return strings(c.deployments[static_cast<int>(role)]["spec"]["template"]["spec"]["containers"][0]["args"]);
  };
  const std::vector<std::string> prefill = args_of(Role::kPrefill);
  const auto device = std::find(prefill.begin(), prefill.end(), "--device");
  ASSERT_NE(device, prefill.end());
  ASSERT_NE(device + 1, prefill.end());
  EXPECT_EQ(*(device + 1), "cuda");
  EXPECT_EQ(std::vector<std::string>(prefill.end() - 2, prefill.end()), (std::vector<std::string>{"--device", "cpu"}))
      << "the user's args come after, so they win";
  EXPECT_THAT(args_of(Role::kDecode), ::testing::Not(::testing::Contains("--device")));
  EXPECT_THAT(args_of(Role::kRouter), ::testing::Not(::testing::Contains("--device")));
  p.decode.gpus_per_pod = 8;
  p.router.gpus_per_pod = 1;  // not a thing a router uses: still no --device
  const Children gpu = desiredChildren(p);
  EXPECT_THAT(strings(gpu.deployments[static_cast<int>(Role::kDecode)]["spec"]["template"]["spec"]["containers"][0]["args"]),
              ::testing::IsSupersetOf({"--device", "cuda"}));
  // Several GPUs: one tensor-parallel rank each, meeting in a memory-backed /dev/shm.
  const json& decode_pod = gpu.deployments[static_cast<int>(Role::kDecode)]["spec"]["template"]["spec"];
  const std::vector<std::string> decode_args = strings(decode_pod["containers"][0]["args"]);
  const auto tp = std::find(decode_args.begin(), decode_args.end(), "--tensor-parallel");
  ASSERT_NE(tp, decode_args.end());
  ASSERT_NE(tp + 1, decode_args.end());
  EXPECT_EQ(*(tp + 1), "8");
  EXPECT_THAT(prefill, ::testing::Not(::testing::Contains("--tensor-parallel"))) << "one GPU: no group";
  EXPECT_THAT(decode_pod["volumes"].dump(), ::testing::HasSubstr(R"({"emptyDir":{"medium":"Memory"},"name":"dshm"})"));
  EXPECT_THAT(decode_pod["containers"][0]["volumeMounts"].dump(),
              ::testing::HasSubstr(R"({"mountPath":"/dev/shm","name":"dshm"})"));
  const json& prefill_pod = c.deployments[static_cast<int>(Role::kPrefill)]["spec"]["template"]["spec"];
  EXPECT_THAT(prefill_pod["volumes"].dump(), ::testing::Not(::testing::HasSubstr("dshm")));
  // Several GPUs but the role's args keep it on the CPU: no group, no /dev/shm.
  p.decode.args = {"--device=cpu"};
  const Children cpu = desiredChildren(p);
  const json& cpu_pod = cpu.deployments[static_cast<int>(Role::kDecode)]["spec"]["template"]["spec"];
  EXPECT_THAT(strings(cpu_pod["containers"][0]["args"]), ::testing::Not(::testing::Contains("--tensor-parallel")));
  EXPECT_THAT(cpu_pod["volumes"].dump(), ::testing::Not(::testing::HasSubstr("dshm")));
  EXPECT_THAT(strings(gpu.deployments[static_cast<int>(Role::kRouter)]["spec"]["template"]["spec"]["containers"][0]["args"]),
              ::testing::Not(::testing::Contains("--device")));
}

// Every pod: the pool key mounted as a directory (so a rotation reaches it)
// and passed to the agent; non-root, read-only root filesystem, no
// privilege escalation, every capability dropped.
TEST(ChildrenTest, PodsAreHardenedAndCarryThePoolKey) {
  PoolSpec p = pool();
  const Children c = desiredChildren(p);
  for (Role r : kRoles) {
    const json& spec = c.deployments[static_cast<int>(r)]["spec"]["template"]["spec"];
    const json& container = spec["containers"][0];
    EXPECT_EQ(spec["securityContext"]["runAsNonRoot"], true);
    EXPECT_NE(spec["securityContext"]["runAsUser"], 0);
    EXPECT_EQ(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    EXPECT_EQ(container["securityContext"]["readOnlyRootFilesystem"], true);
    EXPECT_EQ(container["securityContext"]["allowPrivilegeEscalation"], false);
    EXPECT_EQ(container["securityContext"]["capabilities"]["drop"], json::array({"ALL"}));
    EXPECT_FALSE(container["securityContext"]["capabilities"].contains("add")) << "ipcLock is off";
    std::map<std::string, json> volumes, mounts;
    for (const json& v : spec["volumes"]) volumes[v["name"]] = v;
    for (const json& m : container["volumeMounts"]) mounts[m["name"]] = m;
    EXPECT_EQ(volumes["pool-key"]["secret"]["secretName"], "tiny-pool-key");
    EXPECT_FALSE(mounts["pool-key"].contains("subPath")) << "a subPath mount never sees a rotation";
    EXPECT_EQ(mounts["pool-key"]["readOnly"], true);
    const std::vector<std::string> args = strings(container["args"]);
    auto it = std::find(args.begin(), args.end(), "--pool-key-dir");
    ASSERT_NE(it, args.end());
    EXPECT_EQ(*(it + 1), mounts["pool-key"]["mountPath"]);
    EXPECT_EQ(std::find(args.begin(), args.end(), "--api-keys-file"), args.end()) << "no apiKeysSecret";
  }
  const json secret = poolKeySecret(p, std::string(64, 'k'));
  EXPECT_EQ(secret["metadata"]["name"], "tiny-pool-key");
  EXPECT_EQ(secret["stringData"]["key"], std::string(64, 'k'));
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["kind"], "InferencePool") << "deleted with its pool";
}

// spec.router.apiKeysSecret: every role mounts it and checks keys (a
// client that reaches an agent's port directly needs a key too).
TEST(ChildrenTest, EveryRoleMountsTheApiKeysSecret) {
  PoolSpec p = pool();
  p.api_keys_secret = "team-keys";
  const Children c = desiredChildren(p);
  const json& router = c.deployments[static_cast<int>(Role::kRouter)]["spec"]["template"]["spec"];
  std::string mount;
  for (const json& m : router["containers"][0]["volumeMounts"]) {
    if (m["name"] == "api-keys") mount = m["mountPath"];
  }
  ASSERT_FALSE(mount.empty());
  EXPECT_THAT(strings(router["containers"][0]["args"]),
              ::testing::IsSupersetOf(std::vector<std::string>{"--api-keys-file", mount + "/keys.yaml"}));
  bool found = false;
  for (const json& v : router["volumes"]) found |= v.value("/secret/secretName"_json_pointer, "") == "team-keys";
  EXPECT_TRUE(found);
  for (Role r : {Role::kPrefill, Role::kDecode}) {
    const json& spec = c.deployments[static_cast<int>(r)]["spec"]["template"]["spec"];
    EXPECT_THAT(strings(spec["containers"][0]["args"]), ::testing::Contains("--api-keys-file"));
  }
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
