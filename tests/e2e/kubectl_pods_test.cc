// The real kubectl against tandem-apiserver for what the process kubelet
// relies on: Nodes and ReplicaSets served, pod defaults, the binding
// subresource, graceful deletion of scheduled pods, and pods/log's errors
// (its success path, through a kubelet, is in the kubelet's own tests).

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "src/http/client.h"
#include "tests/e2e/apiserver_fixture.h"

namespace tandem::e2e {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

class KubectlPodsTest : public ApiServerFixture {
 protected:
  void apply(const std::string& name, const std::string& yaml) {
    auto r = kubectl("apply -f " + writeTemp(name, yaml));
    ASSERT_EQ(r.rc, 0) << r.output;
  }
  http::ClientResponse bind(const std::string& pod, const std::string& node) {
    auto r = http::httpPost(baseUrl() + "/api/v1/namespaces/default/pods/" + pod + "/binding",
                            json{{"apiVersion", "v1"},
                                 {"kind", "Binding"},
                                 {"metadata", {{"name", pod}}},
                                 {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}});
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : http::ClientResponse{};
  }
};

constexpr const char* kNode = R"(apiVersion: v1
kind: Node
metadata: {name: n1}
)";

constexpr const char* kPod = R"(apiVersion: v1
kind: Pod
metadata: {name: p1}
spec:
  terminationGracePeriodSeconds: 45
  containers: [{name: c, image: tandem, command: [sleep, "100"]}]
)";

TEST_F(KubectlPodsTest, NodesAndReplicaSetsAreServedWithTheirColumns) {
  apply("node.yaml", kNode);
  auto r = kubectl("get nodes");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("n1"));
  apply("rs.yaml", R"(apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: web-abc}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: tandem, command: [sleep, "1"]}]}
)");
  r = kubectl("get rs");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("DESIRED"));
  EXPECT_EQ(kubectl("get rs web-abc -o jsonpath={.spec.replicas}").output, "1");
  EXPECT_EQ(kubectl("get rs web-abc -o jsonpath={.spec.template.spec.restartPolicy}").output, "Always");
  r = kubectl("scale rs web-abc --replicas=3");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(kubectl("get rs web-abc -o jsonpath={.spec.replicas}").output, "3");
  EXPECT_EQ(kubectl("get rs web-abc -o jsonpath={.metadata.generation}").output, "2");
}

TEST_F(KubectlPodsTest, APodIsDefaultedPendingAndBoundOnceWithPodScheduled) {
  apply("node.yaml", kNode);
  apply("pod.yaml", kPod);
  EXPECT_EQ(kubectl("get pod p1 -o jsonpath={.status.phase}/{.spec.restartPolicy}/{.spec.schedulerName}").output,
            "Pending/Always/default-scheduler");
  auto b = bind("p1", "n1");
  EXPECT_EQ(b.status, 201) << b.body;
  EXPECT_EQ(kubectl("get pod p1 -o jsonpath={.spec.nodeName}").output, "n1");
  EXPECT_EQ(kubectl("get pod p1 -o 'jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].status}'").output, "True");
  b = bind("p1", "n2");
  EXPECT_EQ(b.status, 409);
  EXPECT_THAT(b.body, HasSubstr("pod p1 is already assigned to node \\\"n1\\\""));
  b = bind("nope", "n1");
  EXPECT_EQ(b.status, 404);
  apply("pod2.yaml", R"(apiVersion: v1
kind: Pod
metadata: {name: p2}
spec: {containers: [{name: c, image: tandem, command: [sleep, "1"]}]}
)");
  auto bad = http::httpPost(baseUrl() + "/api/v1/namespaces/default/pods/p2/binding",
                            json{{"apiVersion", "v1"}, {"kind", "Binding"}, {"target", {{"kind", "Node"}}}});
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->status, 422);
  EXPECT_THAT(bad->body, HasSubstr("target.name"));
}

TEST_F(KubectlPodsTest, AScheduledPodIsKeptForItsGracePeriodUntilDeletedWithGraceZero) {
  apply("node.yaml", kNode);
  apply("pod.yaml", kPod);
  // Not scheduled yet: deleted at once.
  auto r = kubectl("delete pod p1 --wait=false");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(kubectl("get pod p1").output, HasSubstr("NotFound"));

  apply("pod.yaml", kPod);
  ASSERT_EQ(bind("p1", "n1").status, 201);
  r = kubectl("delete pod p1 --wait=false");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(kubectl("get pod p1 -o jsonpath={.metadata.deletionGracePeriodSeconds}").output, "45")
      << "kept for spec.terminationGracePeriodSeconds, for its kubelet to stop it";
  EXPECT_NE(kubectl("get pod p1 -o jsonpath={.metadata.deletionTimestamp}").output, "");
  // A shorter grace shortens it; a longer one does not lengthen it.
  r = kubectl("delete pod p1 --wait=false --grace-period=5");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(kubectl("get pod p1 -o jsonpath={.metadata.deletionGracePeriodSeconds}").output, "5");
  r = kubectl("delete pod p1 --wait=false --grace-period=60");
  EXPECT_EQ(kubectl("get pod p1 -o jsonpath={.metadata.deletionGracePeriodSeconds}").output, "5");
  // What the kubelet sends once the containers stopped.
  auto bad = http::httpSend({.method = "DELETE",
                             .url = baseUrl() + "/api/v1/namespaces/default/pods/p1",
                             .headers = {{"Content-Type", "application/json"}},
                             .body = R"({"gracePeriodSeconds": -3})"});
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->status, 422);
  EXPECT_THAT(bad->body, HasSubstr("gracePeriodSeconds"));
  r = kubectl("delete pod p1 --grace-period=0 --force");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(kubectl("get pod p1").output, HasSubstr("NotFound"));
}

TEST_F(KubectlPodsTest, LogsSayWhyTheyCannotBeRead) {
  apply("node.yaml", kNode);
  apply("pod.yaml", R"(apiVersion: v1
kind: Pod
metadata: {name: two}
spec:
  containers:
  - {name: a, image: tandem, command: [sleep, "1"]}
  - {name: b, image: tandem, command: [sleep, "1"]}
)");
  // kubectl picks the first container itself; the server asks for one.
  auto raw = http::httpGet(baseUrl() + "/api/v1/namespaces/default/pods/two/log");
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->status, 400);
  EXPECT_THAT(raw->body, HasSubstr("a container name must be specified for pod two, choose one of: [a b]"));
  auto r = kubectl("logs two -c z");
  EXPECT_THAT(r.output, HasSubstr("container z is not valid for pod two"));
  r = kubectl("logs two -c a");
  EXPECT_THAT(r.output, HasSubstr("is waiting to start"));
  ASSERT_EQ(bind("two", "n1").status, 201);
  r = kubectl("logs two -c a");
  EXPECT_NE(r.rc, 0);
  EXPECT_THAT(r.output, HasSubstr("node n1 reports no kubelet endpoint"));
}

TEST_F(KubectlPodsTest, EventsRecordedThroughEventsK8sIoShowInKubectlGetEventsAndDescribe) {
  apply("pod.yaml", kPod);
  const std::string uid = kubectl("get pod p1 -o jsonpath={.metadata.uid}").output;
  const json event = {{"apiVersion", "events.k8s.io/v1"},
                      {"kind", "Event"},
                      {"metadata", {{"name", "p1.abc"}, {"namespace", "default"}}},
                      {"eventTime", "2026-11-26T06:00:00.000000Z"},
                      {"reportingController", "tandem.dev/kubelet"},
                      {"reportingInstance", "tandem-local"},
                      {"action", "Create"},
                      {"reason", "Failed"},
                      {"note", "the image is not the local build's"},
                      {"type", "Warning"},
                      {"regarding", {{"kind", "Pod"}, {"namespace", "default"}, {"name", "p1"}, {"uid", uid}}}};
  auto r = http::httpPost(baseUrl() + "/apis/events.k8s.io/v1/namespaces/default/events", event);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->status, 201) << r->body;
  auto got = kubectl("get events");
  EXPECT_THAT(got.output, HasSubstr("REASON"));
  EXPECT_THAT(got.output, HasSubstr("the image is not the local build's"));
  auto described = kubectl("describe pod p1");
  EXPECT_THAT(described.output, HasSubstr("Warning  Failed"));
  EXPECT_THAT(described.output, HasSubstr("tandem.dev/kubelet"));
  ASSERT_EQ(kubectl("delete events.events.k8s.io p1.abc").rc, 0);
  EXPECT_THAT(kubectl("get events").output, HasSubstr("No resources found"));
}

}  // namespace
}  // namespace tandem::e2e
