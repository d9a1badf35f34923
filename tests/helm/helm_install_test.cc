// The chart installed by the real helm on the local cluster (label e2e;
// root, one local cluster at a time): helm install -> the operator runs as
// pods of the chart's Deployment, one of them leading -> an InferencePool
// (examples/inferencepool-tiny.yaml) becomes Ready and serves a completion
// through its router, under the chart's RBAC -> helm upgrade
// with changed values rolls the operator -> helm uninstall leaves nothing
// of the release but the CRD, which Helm documents it keeps.

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/kubelet_fixture.h"

namespace tandem::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kSource = TANDEM_SOURCE_DIR;

class HelmInstallTest : public KubeletApiAccessTest {
 protected:
  void SetUp() override {
    helm_bin_ = std::getenv("TANDEM_HELM") != nullptr ? std::getenv("TANDEM_HELM") : "";
    ASSERT_TRUE(std::filesystem::exists(helm_bin_))
        << "no helm at TANDEM_HELM=\"" << helm_bin_ << "\": ./tandem setup installs it (tests/tools/bin/helm)";
    KubeletApiAccessTest::SetUp();
    ASSERT_EQ(shell(std::string(std::getenv("TANDEM_BIN_DIR")) + "/tandem-make-model --out " + dir_ + "/model").rc, 0);
  }
  CommandResult helm(const std::string& args) {
    return shell("HELM_CACHE_HOME=" + dir_ + "/helm/cache HELM_CONFIG_HOME=" + dir_ + "/helm/config HELM_DATA_HOME=" +
                 dir_ + "/helm/data " + helm_bin_ + " --kubeconfig " + kubeconfig_ + " " + args);
  }
  std::string operatorLogs() {
    return kubectl("-n tandem-system logs -l app.kubernetes.io/name=tandem-operator --tail=40").output +
           kubectl("-n tandem-system logs -l app.kubernetes.io/name=tandem-operator --tail=40 --previous").output +
           kubectl("-n tandem-system get events").output;
  }
  std::string helm_bin_;
};

TEST_F(HelmInstallTest, InstallServeUpgradeUninstall) {
  const std::string chart = kSource + "/helm/tandem";
  auto r = helm("install tandem " + chart + " -n tandem-system --create-namespace -f " + kSource +
                "/examples/helm/values-local.yaml --wait --timeout 120s");
  ASSERT_EQ(r.rc, 0) << r.output << kubectl("-n tandem-system get pods -o wide").output << operatorLogs();
  EXPECT_THAT(r.output, HasSubstr("STATUS: deployed"));
  EXPECT_THAT(r.output, HasSubstr("kubectl apply -f examples/inferencepool-llama-gpu.yaml"));  // NOTES.txt
  EXPECT_EQ(get("-n tandem-system deploy tandem", "{.status.readyReplicas}"), "2");
  EXPECT_EQ(kubectl("get crd inferencepools.serving.tandem.dev").rc, 0);
  EXPECT_THAT(helm("list -n tandem-system").output, HasSubstr("deployed"));

  // Two operators, one holding the Lease: the one whose /metrics says so.
  std::string holder;
  ASSERT_TRUE(eventually([&] { return !(holder = get("-n tandem-system lease tandem", "{.spec.holderIdentity}")).empty(); }, 60))
      << operatorLogs();
  const std::string pods = get("-n tandem-system pods -l app.kubernetes.io/name=tandem-operator",
                               "{range .items[*]}{.metadata.name} {.status.podIP}{\"\\n\"}{end}");
  int leaders = 0, seen = 0;
  std::istringstream lines(pods);
  std::string name, ip;
  while (lines >> name >> ip) {
    ++seen;
    const std::string m = shell("curl -s -m 5 http://" + ip + ":8080/metrics").output;
    if (m.find("\ntandem_operator_leader 1\n") != std::string::npos) {
      ++leaders;
      EXPECT_EQ(name, holder);
    }
  }
  EXPECT_EQ(seen, 2) << pods;
  EXPECT_EQ(leaders, 1) << pods;

  // The local example pool, as a user applies it (its model directory is
  // the node's path that ./tandem up writes in; here the test's model).
  std::string example = readFile(kSource + "/examples/inferencepool-tiny.yaml");
  const std::string placeholder = "path: TANDEM_MODEL_DIR";
  const size_t at = example.find(placeholder);
  ASSERT_NE(at, std::string::npos);
  example.replace(at, placeholder.size(), "path: " + dir_ + "/model");
  apply("inferencepool-tiny.yaml", example);
  ASSERT_TRUE(eventually([&] {
    return get("tpool tiny", "{.status.conditions[?(@.type==\"Ready\")].status}") == "True";
  }, 120)) << kubectl("get tpool tiny -o yaml").output << kubectl("get pods -o wide").output << operatorLogs();
  const std::string endpoint = get("tpool tiny", "{.status.endpoint}");
  ASSERT_FALSE(endpoint.empty());
  const std::string answer = shell("curl -s -m 60 http://" + endpoint +
                                   "/v1/completions -H 'Content-Type: application/json' -d "
                                   "'{\"model\":\"tiny\",\"prompt\":\"through the operator of the chart\",\"max_tokens\":4}'")
                                 .output;
  EXPECT_THAT(answer, HasSubstr("\"choices\"")) << answer;

  // The operators did all that as the chart's ServiceAccount, under the
  // chart's rules (the emulator enforces RBAC for service accounts); what
  // the rules leave out is refused.
  const std::string token = kubectl("-n tandem-system create token tandem --duration 20m").output;
  ASSERT_EQ(token.rfind("eyJ", 0), 0u) << token;
  auto as_operator = [&](const std::string& args) { return kubectl("--token " + token + " " + args); };
  EXPECT_EQ(as_operator("auth whoami -o jsonpath={.status.userInfo.username}").output,
            "system:serviceaccount:tandem-system:tandem");
  for (const char* allowed : {"patch deployments -n default", "create deployments -n default", "watch pods -A",
                              "get secrets -n default", "update leases/tandem -n tandem-system",
                              "patch inferencepools.serving.tandem.dev/status -n default",
                              // The planner: spec.<role>.replicas, the routing ConfigMap, events.
                              "patch inferencepools.serving.tandem.dev -n default", "create configmaps -n default",
                              "patch configmaps -n default", "create events.events.k8s.io -n default",
                              "patch events.events.k8s.io -n default"}) {
    EXPECT_EQ(as_operator(std::string("auth can-i ") + allowed).output, "yes\n") << allowed;
  }
  for (const char* refused : {"list secrets -n default", "delete deployments -n default", "create leases -n tandem-system",
                              "update leases/other -n tandem-system", "delete inferencepools.serving.tandem.dev -n default",
                              "create pods -n default", "get pods/log -n default"}) {
    EXPECT_EQ(as_operator(std::string("auth can-i ") + refused).output, "no\n") << refused;
  }
  // The planner's writes as it makes them (autoscaling is off in this pool,
  // so the operator never does): the replicas with its field manager (the
  // values it already has: nothing scales) and the routing knobs'
  // ConfigMap by server-side apply.
  // (kubectl patch would GET the pool first, which the operator never does;
  // its informer lists and watches.)
  r = as_operator("apply --server-side --field-manager tandem-planner --force-conflicts -f " +
                  writeTemp("planner-replicas.yaml",
                            "apiVersion: serving.tandem.dev/v1alpha1\nkind: InferencePool\n"
                            "metadata: {name: tiny, namespace: default}\n"
                            "spec: {prefill: {replicas: 1}, decode: {replicas: 2}}\n"));
  EXPECT_EQ(r.rc, 0) << r.output;
  r = as_operator("apply --server-side --field-manager tandem-planner --force-conflicts -f " +
                  writeTemp("routing-knobs.yaml",
                            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: rbac-check-routing, namespace: default}\n"
                            "data: {knobs.json: '{\"loadFloorWeight\": 1.5}'}\n"));
  EXPECT_EQ(r.rc, 0) << r.output;
  r = as_operator("get secrets -A");
  EXPECT_NE(r.rc, 0);
  EXPECT_THAT(r.output, HasSubstr("User \"system:serviceaccount:tandem-system:tandem\" cannot list resource "
                                  "\"secrets\" in API group \"\" at the cluster scope"));

  // helm upgrade with a changed value rolls the operator's pods.
  r = helm("upgrade tandem " + chart + " -n tandem-system --reuse-values --set operator.workers=3 --wait --timeout 120s");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("REVISION: 2"));
  EXPECT_THAT(get("-n tandem-system deploy tandem", "{.spec.template.spec.containers[0].args}"), HasSubstr("--workers=3"));
  EXPECT_EQ(kubectl("-n tandem-system rollout status deploy/tandem --timeout=60s").rc, 0);
  EXPECT_THAT(helm("history tandem -n tandem-system").output, HasSubstr("Upgrade complete"));
  // The pool is still served: the new operators took it over.
  EXPECT_THAT(kubectl("patch tpool tiny --type merge -p '{\"spec\":{\"decode\":{\"replicas\":1}}}'").output, HasSubstr("patched"));
  EXPECT_TRUE(eventually([&] { return get("tpool tiny", "{.status.decode.summary}") == "1/1"; }, 90))
      << kubectl("get tpool tiny -o yaml").output << operatorLogs();

  // The pool goes first (its children with it), then the release.
  ASSERT_EQ(kubectl("delete tpool tiny --timeout=60s").rc, 0);
  EXPECT_TRUE(eventually([&] { return get("deploy", "{.items[*].metadata.name}").empty(); }, 60))
      << kubectl("get deploy").output;
  r = helm("uninstall tandem -n tandem-system --wait --timeout 60s");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("uninstalled"));
  for (const char* kind : {"deploy", "rs", "sa", "svc", "cm", "role", "rolebinding", "lease", "secrets"}) {
    const std::string left = get(std::string("-n tandem-system ") + kind, "{.items[*].metadata.name}");
    // The namespace's own default ServiceAccount and root CA ConfigMap are the cluster's, not the release's.
    EXPECT_THAT(left, Not(HasSubstr("tandem"))) << kind << ": " << left;
  }
  EXPECT_EQ(get("-n tandem-system secrets -l owner=helm", "{.items[*].metadata.name}"), "");
  EXPECT_THAT(get("clusterrole", "{.items[*].metadata.name}"), Not(HasSubstr("tandem")));
  EXPECT_THAT(get("clusterrolebinding", "{.items[*].metadata.name}"), Not(HasSubstr("tandem")));
  EXPECT_TRUE(eventually([&] { return get("-n tandem-system pods", "{.items[*].metadata.name}").empty(); }, 30));
  // What Helm keeps: the CRD (crds/ is never deleted by helm uninstall).
  EXPECT_EQ(kubectl("get crd inferencepools.serving.tandem.dev").rc, 0);
}

}  // namespace
}  // namespace tandem::e2e
