// tandem-operator on the local cluster (label operator; root, for the pod
// network), driven by the real kubectl: a pool becomes its children and
// Ready, serves through its router Service, scales decode up and down while
// streams run, reverts a direct edit of a child, and leaves nothing when
// deleted; invalid pools are refused or reported; an unschedulable role is
// named and recovers. Restarts, takeover and API faults:
// operator_chaos_test.cc.

#include <algorithm>
#include <atomic>
#include <regex>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/operator_fixture.h"

namespace tandem::e2e {
namespace {

using ::testing::HasSubstr;

TEST_F(OperatorTest, APoolBecomesReadyServesScalesWhileStreamingAndLeavesNothingWhenDeleted) {
  apply("pool.yaml", pool("tiny", R"(  engine: {numBlocks: 2048}
  prefill: {args: [--kv-tls, "posix,cma,tcp"]}
  decode: {replicas: 1, args: [--kv-tls, "posix,cma,tcp"]}
  network:
    kvTrafficClass: {infinibandServiceLevel: 1, trafficClass: 96}
    collectiveTrafficClass: {infinibandServiceLevel: 0, trafficClass: 104}
)"));
  ASSERT_TRUE(eventually([&] { return condition("tiny", "Ready", "status") == "True"; }, 120))
      << kubectl("get tpool tiny -o yaml").output << kubectl("get pods -o wide").output << operatorLog()
      << kubectl("logs deploy/tiny-router --previous").output << kubectl("logs deploy/tiny-router").output
      << kubectl("get events").output;
  EXPECT_EQ(get("tpool tiny", "{.status.decode.summary}"), "1/1");
  // Children with owner references, QoS on the decode pod.
  EXPECT_EQ(get("deploy tiny-decode", "{.metadata.ownerReferences[0].kind}"), "InferencePool");
  const std::string decode_pod = "pods -l serving.tandem.dev/role=decode";
  EXPECT_EQ(get(decode_pod, "{.items[0].metadata.annotations.serving\\.tandem\\.dev/kv-traffic-class}"), "sl=1,tc=96");
  EXPECT_EQ(get(decode_pod, "{.items[0].spec.containers[0].env[?(@.name==\"UCX_IB_SL\")].value}"), "1");
  EXPECT_EQ(get(decode_pod, "{.items[0].spec.containers[0].env[?(@.name==\"NCCL_IB_TC\")].value}"), "104");

  const std::string endpoint = get("tpool tiny", "{.status.endpoint}");
  ASSERT_FALSE(endpoint.empty());
  auto complete = [&](int max_tokens, bool stream, const std::string& at) {
    const std::string body = R"({"model":"tiny","prompt":"a prompt for the router of the pool","max_tokens":)" +
                             std::to_string(max_tokens) + (stream ? R"(,"ignore_eos":true,"stream":true})" : "}");
    return shell("curl -s -N -m 240 http://" + at + "/v1/completions -H 'Content-Type: application/json' -d '" + body +
                 "'")
        .output;
  };
  EXPECT_THAT(complete(4, false, endpoint), HasSubstr("\"choices\"")) << operatorLog();

  // Decode 1 -> 3: three decode agents, all in the router's set.
  ASSERT_EQ(kubectl("patch tpool tiny --type merge -p '{\"spec\":{\"decode\":{\"replicas\":3}}}'").rc, 0);
  ASSERT_TRUE(eventually([&] { return get("tpool tiny", "{.status.decode.summary}") == "3/3"; }, 90))
      << kubectl("get pods -o wide").output;
  auto routerDecodeWorkers = [&] {
    const std::string m = shell("curl -s -m 5 http://" + endpoint + "/metrics").output;
    const std::regex series("tandem_router_worker_sessions\\{[^}]*worker=\"tiny-decode-");
    return std::distance(std::sregex_iterator(m.begin(), m.end(), series), std::sregex_iterator());
  };
  EXPECT_TRUE(eventually([&] { return routerDecodeWorkers() == 3; }, 30)) << routerDecodeWorkers();
  EXPECT_THAT(kubectl("get events").output, HasSubstr("decode: 1 -> 3 replicas"));

  // Streams long enough to outlast the scale-down here, whatever the build's
  // speed (an ASan build decodes many times slower): about 14 s each at the
  // measured rate, the faster of two runs (a first one may still be warming
  // and would make the streams end early); longer contexts decode slower
  // still, well within the decode agents' 80 s drain.
  double rate = 0;
  for (int run = 0; run < 2; ++run) {
    const auto calibration = std::chrono::steady_clock::now();
    EXPECT_THAT(complete(400, true, endpoint), HasSubstr("data: [DONE]"));
    rate = std::max(rate, 400 / std::chrono::duration<double>(std::chrono::steady_clock::now() - calibration).count());
  }
  const int stream_tokens = std::clamp(static_cast<int>(rate * 14), 1000, 6000);

  // 3 -> 1 while streams run: none fails, and the emptiest decode pods go.
  // Two streams run on one decode pod (called directly), one through the router.
  const std::string busy = get("pods -l serving.tandem.dev/role=decode", "{.items[0].metadata.name}");
  const std::string busy_ip = get("pod " + busy, "{.status.podIP}");
  std::vector<std::string> streams(3);
  std::vector<std::chrono::steady_clock::time_point> ended(3);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < streams.size(); ++i) {
    clients.emplace_back([&, i] {
      streams[i] = complete(stream_tokens, true, i < 2 ? busy_ip + ":8100" : endpoint);
      ended[i] = std::chrono::steady_clock::now();
    });
  }
  // The operator keeps each decode pod's deletion cost from its agent's load.
  const bool costed = eventually([&] {
    const std::string cost = get("pod " + busy, "{.metadata.annotations.controller\\.kubernetes\\.io/pod-deletion-cost}");
    return !cost.empty() && std::stoi(cost) >= 2000;
  });
  EXPECT_TRUE(costed) << kubectl("get pods -l serving.tandem.dev/role=decode -o yaml").output;
  EXPECT_EQ(kubectl("patch tpool tiny --type merge -p '{\"spec\":{\"decode\":{\"replicas\":1}}}'").rc, 0);
  const auto scaled_at = std::chrono::steady_clock::now();
  for (auto& c : clients) c.join();
  for (size_t i = 0; i < streams.size(); ++i) {
    const std::string& s = streams[i];
    EXPECT_THAT(s, HasSubstr("data: [DONE]")) << "a stream failed on scale-down: " << s.substr(s.size() > 300 ? s.size() - 300 : 0);
    EXPECT_GT(ended[i], scaled_at) << "the stream ended before the scale-down: nothing was tested";
  }
  ASSERT_TRUE(eventually([&] { return get("tpool tiny", "{.status.decode.summary}") == "1/1"; }, 120));
  EXPECT_EQ(get("pods -l serving.tandem.dev/role=decode", "{.items[*].metadata.name}"), busy)
      << "the busiest decode pod was removed instead of the empty ones";
  ASSERT_TRUE(eventually([&] { return get("tpool tiny", "{.status.decode.summary}") == "1/1"; }, 120));

  // A direct edit of a child is reverted, saying why.
  ASSERT_EQ(kubectl("scale deploy/tiny-router --replicas=2").rc, 0);
  EXPECT_TRUE(eventually([&] { return kubectl("get events").output.find("the pool is the source of truth") != std::string::npos; }))
      << kubectl("get events").output;
  EXPECT_TRUE(eventually([&] { return get("deploy tiny-router", "{.spec.replicas}") == "1"; }));

  // Deleted: nothing is left, its series included.
  const std::string series = "tandem_pool_ready_replicas{namespace=\"default\",pool=\"tiny\"";
  EXPECT_THAT(shell("curl -s -m 5 http://127.0.0.1:" + std::to_string(metrics_port_) + "/metrics").output,
              HasSubstr(series));
  auto del = kubectl("delete tpool tiny --timeout=60s");
  EXPECT_EQ(del.rc, 0) << del.output;
  EXPECT_TRUE(eventually([&] { return get("pods,deploy,svc,cm -l app.kubernetes.io/instance=tiny", "{.items[*].metadata.name}").empty(); }, 120))
      << kubectl("get pods,deploy,svc,cm -l app.kubernetes.io/instance=tiny").output;
  EXPECT_EQ(shell("pgrep -f 'tandem-agent --config /etc/tandem/agent[.]yaml' | wc -l").output, "0\n")
      << "an agent process outlived its pool";
  EXPECT_TRUE(eventually([&] {
    return shell("curl -s -m 5 http://127.0.0.1:" + std::to_string(metrics_port_) + "/metrics").output.find(series) ==
           std::string::npos;
  })) << "the deleted pool's series are still exported";
}

TEST_F(OperatorTest, InvalidPoolsAreRefusedNamingTheFieldOrReportedAsDegraded) {
  auto refused = [&](const std::string& extra) {
    return kubectl("apply -f " + writeTemp("bad.yaml", pool("bad", extra))).output;
  };
  EXPECT_THAT(refused("  decode: {replicas: -1}\n"), HasSubstr("spec.decode.replicas"));
  EXPECT_THAT(refused("  network: {kvTrafficClass: {infinibandServiceLevel: 16}}\n"),
              HasSubstr("spec.network.kvTrafficClass.infinibandServiceLevel"));
  EXPECT_THAT(refused("  network: {collectiveTrafficClass: {trafficClass: 300}}\n"),
              HasSubstr("spec.network.collectiveTrafficClass.trafficClass"));
  EXPECT_THAT(refused("  decode: {replicas: 1, gpus: 8}\n"), HasSubstr("unknown field \"spec.decode.gpus\""));
  EXPECT_THAT(kubectl("apply -f " + writeTemp("both.yaml", "apiVersion: serving.tandem.dev/v1alpha1\nkind: InferencePool\n"
                                                           "metadata: {name: bad}\nspec: {model: {name: tiny, path: /m, pvc: m}}\n"))
                  .output,
              HasSubstr("give model.path or model.pvc, not both"))
      << "a CEL rule of the CRD";
  auto no_model = kubectl("apply -f " + writeTemp("nomodel.yaml",
                                                  "apiVersion: serving.tandem.dev/v1alpha1\nkind: InferencePool\n"
                                                  "metadata: {name: bad}\nspec: {image: tandem}\n"));
  EXPECT_NE(no_model.rc, 0);
  EXPECT_THAT(no_model.output, HasSubstr("spec.model"));
  EXPECT_THAT(kubectl("get tpool").output, ::testing::Not(HasSubstr("bad")));

  // What a schema cannot catch: Degraded, with the field and an event.
  apply("relative.yaml", "apiVersion: serving.tandem.dev/v1alpha1\nkind: InferencePool\nmetadata: {name: relative}\n"
                         "spec: {model: {name: tiny, path: models/tiny}}\n");
  ASSERT_TRUE(eventually([&] { return condition("relative", "Degraded", "status") == "True"; }, 30)) << operatorLog();
  EXPECT_EQ(condition("relative", "Degraded", "reason"), "InvalidSpec");
  EXPECT_EQ(condition("relative", "Degraded", "message"),
            "spec.model.path: \"models/tiny\" must be an absolute path on the node");
  EXPECT_EQ(condition("relative", "Ready", "status"), "False");
  EXPECT_THAT(kubectl("get events").output, HasSubstr("InvalidSpec"));
  EXPECT_TRUE(get("deploy -l app.kubernetes.io/instance=relative", "{.items[*].metadata.name}").empty());
}

class OperatorGpuNodesTest : public OperatorTest {
 protected:
  void SetUp() override {
    nodes_ = {"cpu-a cpu=8 memory=16Gi", "gpu-a cpu=32 memory=64Gi nvidia.com/gpu=2"};
    OperatorTest::SetUp();
  }
};

// A pool that asks for more GPUs than any node has says so, naming the
// role, and recovers when a node that fits joins.
TEST_F(OperatorGpuNodesTest, AnUnschedulableRoleIsReportedAndRecoversWhenANodeIsAdded) {
  // The operator gives a role with GPUs --device cuda (and with several,
  // --tensor-parallel); the emulated nodes' GPUs are not real, so this
  // pool's args keep its agents on the CPU, in one process.
  apply("pool.yaml", pool("big", "  decode: {replicas: 1, gpusPerPod: 4, args: [\"--device\", \"cpu\"]}\n"));
  ASSERT_TRUE(eventually([&] { return condition("big", "Ready", "reason") == "Unschedulable"; }, 60))
      << kubectl("get tpool big -o yaml").output << kubectl("get pods -o wide").output;
  EXPECT_EQ(condition("big", "Ready", "status"), "False");
  EXPECT_THAT(condition("big", "Ready", "message"), ::testing::StartsWith("decode: 0/2 nodes are available"));
  EXPECT_THAT(condition("big", "Ready", "message"), HasSubstr("Insufficient nvidia.com/gpu"));
  EXPECT_EQ(condition("big", "Progressing", "reason"), "Unschedulable") << "blocked on capacity, not rolling";

  // A node with enough GPUs joins (here: the kubelet restarted with one more).
  stopKubelet(SIGTERM);
  nodes_.push_back("gpu-b cpu=32 memory=64Gi nvidia.com/gpu=8");
  startKubelet();
  ASSERT_TRUE(eventually([&] { return condition("big", "Ready", "status") == "True"; }, 120))
      << kubectl("get tpool big -o yaml").output << kubectl("get pods -o wide").output;
  EXPECT_EQ(get("pods -l serving.tandem.dev/role=decode", "{.items[0].spec.nodeName}"), "gpu-b");
}

}  // namespace
}  // namespace tandem::e2e
