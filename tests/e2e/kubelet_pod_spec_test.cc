// What the process kubelet runs for a Pod (e2e/kubelet/pod_spec.h): command
// lines from the local build, the environment with field references, the
// scheduler's needs, probes and the grace period, and every unsupported or
// bad field named by its path.

#include "e2e/kubelet/pod_spec.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tandem::kubelet {
namespace {

using nlohmann::json;

const PodFacts kFacts{.name = "decode-0", .ns = "serving", .pod_ip = "10.244.77.5", .node_name = "node-a",
                      .bin_dir = "/opt/tandem/bin"};

json decodePod() {
  return json::parse(R"({
    "metadata": {"name": "decode-0", "namespace": "serving"},
    "spec": {
      "terminationGracePeriodSeconds": 45,
      "nodeSelector": {"pool": "gpu"},
      "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
      "containers": [{
        "name": "agent",
        "image": "ghcr.io/acme/tandem:0.1",
        "command": ["tandem-agent"],
        "args": ["--role", "decode", "--listen", "0.0.0.0:8100"],
        "env": [
          {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
          {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
          {"name": "MODE", "value": "decode"}
        ],
        "ports": [{"containerPort": 8100}, {"containerPort": 8200}],
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": 1}},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8100}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8100}, "failureThreshold": 5}
      }]
    }
  })");
}

TEST(PodSpecTest, ADecodePodBecomesItsCommandLineNeedsAndProbes) {
  auto plan = planPod(decodePod(), kFacts);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->containers.size(), 1u);
  const ContainerPlan& c = plan->containers[0];
  EXPECT_EQ(c.name, "agent");
  EXPECT_EQ(c.spec.argv, (std::vector<std::string>{"/opt/tandem/bin/tandem-agent", "--role", "decode", "--listen",
                                                    "0.0.0.0:8100"}));
  EXPECT_EQ(c.spec.env, (std::vector<std::pair<std::string, std::string>>{{"HOSTNAME", "decode-0"},
                                                                          {"POD_NAME", "decode-0"},
                                                                          {"POD_IP", "10.244.77.5"},
                                                                          {"MODE", "decode"}}))
      << "HOSTNAME is the pod's name, as Kubernetes sets it";
  EXPECT_EQ(c.ports, (std::vector<int>{8100, 8200}));
  ASSERT_TRUE(c.readiness && c.liveness);
  EXPECT_EQ(c.readiness->path, "/readyz");
  EXPECT_EQ(c.readiness->port, 8100);
  EXPECT_EQ(c.readiness->spec.period, std::chrono::seconds(2));
  EXPECT_EQ(c.liveness->spec.failure_threshold, 5);
  EXPECT_EQ(c.liveness->spec.period, std::chrono::seconds(10));  // Kubernetes' default
  EXPECT_EQ(plan->grace, std::chrono::seconds(45));
  EXPECT_EQ(plan->needs.requests.at("cpu"), 500);
  EXPECT_EQ(plan->needs.requests.at("memory"), (int64_t{1} << 30) * 1000);
  EXPECT_EQ(plan->needs.requests.at("nvidia.com/gpu"), 1000);
  EXPECT_EQ(plan->needs.node_selector.at("pool"), "gpu");
  ASSERT_EQ(plan->needs.tolerations.size(), 1u);
  EXPECT_EQ(plan->needs.tolerations[0].op, "Exists");
}

TEST(PodSpecTest, RequestsAreSummedOverContainersAndDefaultsApply) {
  json pod = json::parse(R"({"spec": {"containers": [
    {"name": "a", "image": "tandem", "command": ["/bin/true"], "resources": {"requests": {"cpu": "250m"}}},
    {"name": "b", "image": "registry:5000/tandem@sha256:abc", "command": ["x"], "resources": {"requests": {"cpu": "1"}}}
  ]}})");
  auto plan = planPod(pod, kFacts);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->needs.requests.at("cpu"), 1250);
  EXPECT_EQ(plan->containers[0].spec.argv[0], "/bin/true");  // a path stays as it is
  EXPECT_EQ(plan->grace, std::chrono::seconds(30));
  EXPECT_FALSE(plan->containers[0].readiness);
}

// As the API server defaults it: a resource given only a limit requests it.
TEST(PodSpecTest, ALimitWithoutARequestIsTheRequest) {
  json pod = decodePod();
  pod["spec"]["containers"][0]["resources"] = json::parse(R"({"limits": {"nvidia.com/gpu": 2, "cpu": "4"},
                                                               "requests": {"cpu": "1"}})");
  auto plan = planPod(pod, kFacts);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->needs.requests.at("nvidia.com/gpu"), 2000);
  EXPECT_EQ(plan->needs.requests.at("cpu"), 1000);  // the request wins where there is one
}

TEST(PodSpecTest, EachBadOrUnsupportedFieldIsNamedByItsPath) {
  auto msg = [](json pod) { return std::string(planPod(pod, kFacts).status().message()); };
  auto with = [](const char* path, json value) {
    json pod = decodePod();
    pod[json::json_pointer(path)] = std::move(value);
    return pod;
  };
  EXPECT_EQ(msg(json::object()), "spec: required");
  EXPECT_EQ(msg(with("/spec/containers", json::array())), "spec.containers: at least one container is required");
  EXPECT_EQ(msg(with("/spec/containers/0/image", "nginx:1.25")),
            "spec.containers[0].image: \"nginx:1.25\": only images whose repository ends in \"tandem\" run here (the "
            "local build)");
  EXPECT_EQ(msg(with("/spec/containers/0/command", json::array())),
            "spec.containers[0].command: required here (the local build has no image entrypoint)");
  EXPECT_EQ(msg(with("/spec/containers/0/args/1", 7)), "spec.containers[0].args[1]: expected a string");
  EXPECT_EQ(msg(with("/spec/containers/0/env/1/valueFrom/fieldRef/fieldPath", "status.hostIP")),
            "spec.containers[0].env[1].valueFrom.fieldRef.fieldPath: \"status.hostIP\" is not one of metadata.name, "
            "metadata.namespace, status.podIP, spec.nodeName");
  EXPECT_EQ(msg(with("/spec/containers/0/env/1/valueFrom", json{{"secretKeyRef", json::object()}})),
            "spec.containers[0].env[1].valueFrom.secretKeyRef.name: required");
  EXPECT_EQ(msg(with("/spec/containers/0/env/1/valueFrom", json{{"resourceFieldRef", {{"resource", "limits.cpu"}}}})),
            "spec.containers[0].env[1].valueFrom: expected fieldRef, configMapKeyRef or secretKeyRef "
            "(resourceFieldRef is not supported here)");
  EXPECT_EQ(msg(with("/spec/containers/0/env/1/valueFrom", json{{"configMapKeyRef", {{"name", "x"}, {"key", "k"}}}})),
            "spec.containers[0].env[1].valueFrom.configMapKeyRef: this kubelet has no API access to read ConfigMap x");
  EXPECT_EQ(msg(with("/spec/containers/0/lifecycle", json{{"preStop", {{"exec", {{"command", {"true"}}}}}}})),
            "spec.containers[0].lifecycle.preStop: only httpGet hooks are supported here");
  EXPECT_EQ(msg(with("/spec/containers/0/lifecycle", json{{"postStart", {{"httpGet", {{"port", 8100}}}}}})),
            "spec.containers[0].lifecycle.postStart: not supported here");
  EXPECT_EQ(msg(with("/spec/containers/0/lifecycle", json{{"preStop", {{"httpGet", {{"port", 0}}}}}})),
            "spec.containers[0].lifecycle.preStop.httpGet.port: expected a port number 1-65535");
  EXPECT_EQ(msg(with("/spec/containers/0/ports/0/containerPort", 70000)),
            "spec.containers[0].ports[0].containerPort: expected a port number 1-65535");
  EXPECT_NE(msg(with("/spec/containers/0/resources/requests/cpu", "lots"))
                .find("spec.containers[0].resources.requests[\"cpu\"]: quantity \"lots\""),
            std::string::npos);
  EXPECT_EQ(msg(with("/spec/containers/0/readinessProbe", json{{"exec", {{"command", {"true"}}}}})),
            "spec.containers[0].readinessProbe: only httpGet probes are supported here");
  EXPECT_EQ(msg(with("/spec/containers/0/livenessProbe/successThreshold", 2)),
            "spec.containers[0].livenessProbe.successThreshold: must be 1");
  EXPECT_EQ(msg(with("/spec/terminationGracePeriodSeconds", -1)), "spec.terminationGracePeriodSeconds: expected 0 to 86400");
  EXPECT_EQ(msg(with("/spec/containers/0/startupProbe", json{{"httpGet", {{"port", 8100}}}})),
            "spec.containers[0].startupProbe: not supported here");
  EXPECT_EQ(msg(with("/spec/initContainers", json::array({json::object()}))), "spec.initContainers: not supported here yet");
  EXPECT_EQ(msg(with("/spec/containers/0/ports", "8100")), "spec.containers[0].ports: expected a list");
  EXPECT_EQ(msg(with("/spec/nodeSelector", "gpu")), "spec.nodeSelector: expected an object");
  EXPECT_EQ(msg(with("/spec/containers/0/readinessProbe/successThreshold", 4294967297)),
            "spec.containers[0].readinessProbe.successThreshold: too large (at most 86400)");
  EXPECT_EQ(msg(with("/spec/tolerations/0/operator", "In")), "spec.tolerations[0].operator: expected Equal or Exists");
  EXPECT_EQ(msg(with("/spec/containers/0/readinessProbe/httpGet/port", "metrics")),
            "spec.containers[0].readinessProbe.httpGet.port: \"metrics\" names none of the container's ports");
}

TEST(PodSpecTest, VariableReferencesExpandAsKubernetesDoes) {
  json pod = decodePod();
  json& c = pod["spec"]["containers"][0];
  c["env"] = {{{"name", "IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}},
              {{"name", "KV"}, {"value", "$(IP):8200"}},
              {{"name", "LATER"}, {"value", "$(NEXT)"}},
              {{"name", "NEXT"}, {"value", "x"}}};
  c["command"] = {"tandem-agent"};
  c["args"] = {"--kv-listen", "$(KV)", "--literal", "$$(IP)", "--unknown", "$(NOPE)", "--dollar", "a$b$"};
  auto plan = planPod(pod, kFacts);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto& argv = plan->containers[0].spec.argv;
  EXPECT_EQ(argv[2], kFacts.pod_ip + ":8200");
  EXPECT_EQ(argv[4], "$(IP)");
  EXPECT_EQ(argv[6], "$(NOPE)");
  EXPECT_EQ(argv[8], "a$b$");
  EXPECT_EQ(plan->containers[0].spec.env[3].second, "$(NEXT)") << "only variables defined before it";
}

TEST(PodSpecTest, AProbeMayNameAContainerPort) {
  json pod = decodePod();
  pod["spec"]["containers"][0]["ports"] = {{{"name", "http"}, {"containerPort", 8200}}};
  pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = "http";
  auto plan = planPod(pod, kFacts);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->containers[0].readiness->port, 8200);
}

}  // namespace
}  // namespace tandem::kubelet
