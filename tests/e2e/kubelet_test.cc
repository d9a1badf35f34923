// tandem-kubelet against tandem-apiserver, driven by the real kubectl
// (label e2e; root, for the pod network): pods run as processes with IPs of
// their own, logs, probes, restarts, graceful deletion, scheduling over
// simulated nodes, bad manifests, and a kubelet killed with SIGKILL.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/kubelet_fixture.h"

namespace tandem::e2e {
namespace {

using ::testing::HasSubstr;

// A container that prints its environment and then serves HTTP on 8000.
constexpr const char* kWebPod = R"yaml(apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: web
    image: ghcr.io/example/tandem:dev
    command: [/bin/sh, -c]
    args:
    - echo "pod $POD_NAME in $POD_NAMESPACE at $POD_IP on $NODE, host $(hostname)"; trap 'echo stopping; exit 0' TERM;
      /usr/bin/python3 -m http.server 8000 --bind 0.0.0.0 & wait
    env:
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
    ports: [{containerPort: 8000}]
    readinessProbe:
      httpGet: {path: /, port: 8000}
      periodSeconds: 1
)yaml";

TEST_F(KubeletTest, APodRunsAsAProcessWithItsOwnAddressProbesAndLogs) {
  apply("web.yaml", kWebPod);
  ASSERT_TRUE(eventually([&] { return get("pod web", "{.status.conditions[?(@.type==\"Ready\")].status}") == "True"; }))
      << kubectl("get pod web -o yaml").output << kubeletLog();
  const std::string ip = get("pod web", "{.status.podIP}");
  EXPECT_THAT(ip, ::testing::StartsWith(cidr_prefix_));
  EXPECT_EQ(get("pod web", "{.status.phase}"), "Running");
  auto wide = kubectl("get pods -o wide");
  EXPECT_THAT(wide.output, HasSubstr(ip));
  EXPECT_THAT(wide.output, HasSubstr("tandem-local"));
  // The host reaches the pod's own address and port.
  EXPECT_EQ(shell("curl -s -o /dev/null -w '%{http_code}' -m 5 http://" + ip + ":8000/").output, "200");
  auto logs = kubectl("logs web");
  EXPECT_THAT(logs.output, HasSubstr("pod web in default at " + ip + " on tandem-local, host web")) << logs.output;
  EXPECT_THAT(kubectl("logs web --tail=1").output, ::testing::Not(HasSubstr("pod web in")));

  // Deletion: SIGTERM (the container's trap runs), then the pod is gone.
  const std::string pid = std::regex_replace(get("pod web", "{.status.containerStatuses[0].containerID}"),
                                             std::regex("process://"), "");
  ASSERT_FALSE(pid.empty());
  auto del = kubectl("delete pod web --timeout=20s");
  ASSERT_EQ(del.rc, 0) << del.output;
  EXPECT_THAT(kubectl("get pod web").output, HasSubstr("NotFound"));
  EXPECT_NE(kill(std::stoi(pid), 0), 0) << "the container's process outlived its pod";
  EXPECT_THAT(readFile(dir_ + "/kubelet/pods/default/web/web.log"), HasSubstr("stopping"));
  EXPECT_THAT(shell("ip netns list").output, ::testing::Not(HasSubstr(netnsPrefix() + "default.web")));
}

TEST_F(KubeletTest, AContainerThatIgnoresSigtermIsKilledAfterTheGracePeriod) {
  apply("stubborn.yaml", R"(apiVersion: v1
kind: Pod
metadata: {name: stubborn}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: tandem, command: [/bin/sh, -c, "trap '' TERM; while true; do sleep 0.1; done"]}
)");
  ASSERT_TRUE(eventually([&] { return get("pod stubborn", "{.status.phase}") == "Running"; })) << kubeletLog();
  const auto t0 = std::chrono::steady_clock::now();
  auto del = kubectl("delete pod stubborn --timeout=20s");
  ASSERT_EQ(del.rc, 0) << del.output;
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, std::chrono::milliseconds(900)) << "killed before its grace period";
  EXPECT_LT(took, std::chrono::seconds(10));
}

TEST_F(KubeletTest, ACrashingContainerRestartsWithBackOff) {
  apply("crash.yaml", R"(apiVersion: v1
kind: Pod
metadata: {name: crash}
spec:
  containers:
  - {name: c, image: tandem, command: [/bin/sh, -c, "echo about to fail; exit 3"]}
)");
  ASSERT_TRUE(eventually([&] { return get("pod crash", "{.status.containerStatuses[0].restartCount}") == "1"; }))
      << kubectl("get pod crash -o yaml").output << kubectl("get events").output << kubeletLog();
  EXPECT_EQ(get("pod crash", "{.status.containerStatuses[0].state.waiting.reason}"), "CrashLoopBackOff");
  EXPECT_EQ(get("pod crash", "{.status.containerStatuses[0].lastState.terminated.exitCode}"), "3");
  EXPECT_THAT(kubectl("logs crash").output, HasSubstr("about to fail"));
  EXPECT_THAT(kubectl("get events").output, HasSubstr("BackOff"));
  // The second start comes after the first back-off (10 s), not at once.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  EXPECT_EQ(get("pod crash", "{.status.containerStatuses[0].restartCount}"), "1");
  ASSERT_TRUE(eventually([&] { return get("pod crash", "{.status.containerStatuses[0].restartCount}") == "2"; }));
  EXPECT_THAT(kubectl("logs crash --previous").output, HasSubstr("about to fail"));
}

TEST_F(KubeletTest, BadManifestsSayWhatIsWrongInStatusAndEvents) {
  apply("bad.yaml", R"(apiVersion: v1
kind: Pod
metadata: {name: badimage}
spec:
  containers: [{name: c, image: nginx:1.25, command: [nginx]}]
---
apiVersion: v1
kind: Pod
metadata: {name: nocommand}
spec:
  containers: [{name: c, image: tandem}]
---
apiVersion: v1
kind: Pod
metadata: {name: deafprobe}
spec:
  containers:
  - name: c
    image: tandem
    command: [/bin/sleep, "100"]
    readinessProbe: {httpGet: {path: /healthz, port: 8100}, periodSeconds: 1}
)");
  ASSERT_TRUE(eventually([&] {
    return get("pod badimage", "{.status.containerStatuses[0].state.waiting.reason}") == "CreateContainerConfigError";
  })) << kubectl("get pod badimage -o yaml").output;
  EXPECT_THAT(get("pod badimage", "{.status.containerStatuses[0].state.waiting.message}"),
              HasSubstr("spec.containers[0].image: \"nginx:1.25\""));
  ASSERT_TRUE(eventually([&] {
    return get("pod nocommand", "{.status.containerStatuses[0].state.waiting.message}")
               .find("spec.containers[0].command: required") != std::string::npos;
  })) << kubectl("get pod nocommand -o yaml").output;
  EXPECT_THAT(kubectl("get events -o 'jsonpath={.items[*].message}'").output, HasSubstr("nginx:1.25"));
  // A probe on a port nothing listens on: running, never ready, and said so.
  ASSERT_TRUE(eventually([&] {
    return kubectl("get events -o 'jsonpath={.items[*].message}'").output.find("Readiness probe failed") !=
           std::string::npos;
  })) << kubectl("get events").output;
  EXPECT_EQ(get("pod deafprobe", "{.status.phase}"), "Running");
  EXPECT_EQ(get("pod deafprobe", "{.status.conditions[?(@.type==\"Ready\")].status}"), "False");
}

TEST_F(KubeletTest, ADeploymentRollsOutScalesDownByDeletionCostAndRollsOutAnUpdate) {
  apply("deploy.yaml", R"(apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: web
        image: tandem
        command: [/bin/sh, -c, 'trap "exit 0" TERM; /usr/bin/python3 -m http.server 8000 & wait']
        readinessProbe: {httpGet: {path: /, port: 8000}, periodSeconds: 1}
)");
  auto r = kubectl("rollout status deploy/web --timeout=60s");
  ASSERT_EQ(r.rc, 0) << r.output << kubeletLog();
  EXPECT_THAT(r.output, HasSubstr("successfully rolled out"));
  const std::string first_rs = get("rs", "{.items[*].metadata.name}");
  EXPECT_TRUE(std::regex_match(first_rs, std::regex("web-[a-z0-9]{10}"))) << first_rs;
  EXPECT_EQ(get("deploy web", "{.status.readyReplicas}/{.status.updatedReplicas}/{.status.availableReplicas}"), "3/3/3");
  const std::string ips = get("pods", "{.items[*].status.podIP}");
  std::istringstream split(ips);
  std::set<std::string> distinct{std::istream_iterator<std::string>(split), std::istream_iterator<std::string>()};
  EXPECT_EQ(distinct.size(), 3u) << ips;

  // Scale down: the pod with the lowest deletion cost goes.
  std::istringstream names(get("pods", "{.items[*].metadata.name}"));
  std::vector<std::string> pods{std::istream_iterator<std::string>(names), std::istream_iterator<std::string>()};
  ASSERT_EQ(pods.size(), 3u);
  for (size_t i = 0; i < pods.size(); ++i) {
    const std::string cost = i == 1 ? "-5" : "100";
    ASSERT_EQ(kubectl("annotate pod " + pods[i] + " controller.kubernetes.io/pod-deletion-cost=" + cost).rc, 0);
  }
  ASSERT_EQ(kubectl("scale deploy/web --replicas=2").rc, 0);
  ASSERT_TRUE(eventually([&] { return kubectl("get pod " + pods[1]).output.find("NotFound") != std::string::npos; }))
      << kubectl("get pods").output;
  EXPECT_THAT(get("pods", "{.items[*].metadata.name}"), HasSubstr(pods[0]));
  EXPECT_THAT(get("pods", "{.items[*].metadata.name}"), HasSubstr(pods[2]));

  // A template change rolls out through a second ReplicaSet.
  ASSERT_EQ(kubectl("set env deploy/web COLOR=blue").rc, 0);
  r = kubectl("rollout status deploy/web --timeout=60s");
  ASSERT_EQ(r.rc, 0) << r.output << kubeletLog();
  EXPECT_THAT(kubectl("get rs").output, HasSubstr(first_rs));
  EXPECT_EQ(get("rs " + first_rs, "{.spec.replicas}"), "0");
  ASSERT_TRUE(eventually([&] { return get("pods", "{.items[*].metadata.name}").find(first_rs) == std::string::npos; }));
  EXPECT_EQ(get("deploy web", "{.status.updatedReplicas}"), "2");

  // Deleting the Deployment takes its ReplicaSets and their pods (and processes) with it.
  ASSERT_EQ(kubectl("delete deploy web").rc, 0);
  EXPECT_TRUE(eventually([&] { return get("pods", "{.items[*].metadata.name}").empty(); })) << kubectl("get pods").output;
  EXPECT_TRUE(eventually([&] { return shell("pgrep -f '[h]ttp.server 8000'").output.empty(); }));
}

TEST_F(KubeletTest, EndpointSlicesFollowReadinessAndAClusterIpReachesOnlyReadyPods) {
  apply("svc.yaml", R"(apiVersion: apps/v1
kind: Deployment
metadata: {name: echo}
spec:
  replicas: 2
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: echo
        image: tandem
        env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
        command: [/bin/sh, -c]
        args:
        - D=/tmp/tndk-$POD_NAME; mkdir -p $D; echo $POD_NAME > $D/name; touch $D/ready; cd $D;
          exec /usr/bin/python3 -m http.server 8000
        ports: [{name: http, containerPort: 8000}]
        readinessProbe: {httpGet: {path: /ready, port: http}, periodSeconds: 1, failureThreshold: 1}
---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  selector: {app: echo}
  ports: [{name: web, port: 80, targetPort: http}]
)");
  ASSERT_EQ(kubectl("rollout status deploy/echo --timeout=60s").rc, 0) << kubeletLog();
  const std::string slice = "endpointslices -l kubernetes.io/service-name=echo";
  ASSERT_TRUE(eventually([&] { return get(slice, "{.items[0].endpoints[*].conditions.ready}") == "true true"; }))
      << kubectl("get " + slice + " -o yaml").output;
  EXPECT_EQ(get(slice, "{.items[0].ports[0].port}"), "8000") << "the named targetPort, resolved";
  const std::string ip = get("svc echo", "{.spec.clusterIP}");
  std::istringstream names(get("pods -l app=echo", "{.items[*].metadata.name}"));
  std::vector<std::string> pods{std::istream_iterator<std::string>(names), std::istream_iterator<std::string>()};
  ASSERT_EQ(pods.size(), 2u);
  // From the host and from inside a pod, the ClusterIP reaches the pods.
  const std::string url = "http://" + ip + ":80/name";
  std::set<std::string> seen;
  for (int i = 0; i < 6; ++i) seen.insert(shell("curl -s -m 5 " + url).output);
  EXPECT_EQ(seen.size(), 2u) << "round-robin over both ready pods";
  EXPECT_THAT(shell("ip netns exec " + netnsPrefix() + "default." + pods[0] + " curl -s -m 5 " + url).output,
              HasSubstr("echo-"));

  // pods[0] stops being ready: its endpoint says so and the ClusterIP stops sending to it.
  std::filesystem::remove("/tmp/tndk-" + pods[0] + "/ready");
  ASSERT_TRUE(eventually([&] { return get(slice, "{.items[0].endpoints[*].conditions.ready}") == "false true"; }))
      << kubectl("get " + slice + " -o yaml").output;
  for (int i = 0; i < 6; ++i) EXPECT_EQ(shell("curl -s -m 5 " + url).output, pods[1] + "\n");

  ASSERT_EQ(kubectl("delete svc echo").rc, 0);
  EXPECT_TRUE(eventually([&] { return get(slice, "{.items[*].metadata.name}").empty(); }));
  EXPECT_TRUE(eventually([&] { return shell("ip -br addr show dev " + bridge_).output.find(ip) == std::string::npos; }));
  ASSERT_EQ(kubectl("delete deploy echo").rc, 0);
  for (const auto& p : pods) std::filesystem::remove_all("/tmp/tndk-" + p);
}

TEST_F(KubeletApiAccessTest, PodsMountVolumesReadTheirConfigAndTalkToTheApiServerInCluster) {
  const std::string mnt = "/run/tandem-test-" + std::to_string(getpid());
  const auto withPaths = [&](std::string yaml) {
    yaml = std::regex_replace(yaml, std::regex("@MNT@"), mnt);
    return std::regex_replace(yaml, std::regex("@DIR@"), dir_);
  };
  std::filesystem::create_directories(dir_ + "/hostdir");
  std::ofstream(dir_ + "/hostdir/marker") << "from-the-node";
  apply("objects.yaml", R"(apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {mode: fast}
---
apiVersion: v1
kind: Secret
metadata: {name: creds}
stringData: {password: s3cret}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: reader}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: service-reader}
rules: [{apiGroups: [""], resources: [services], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: service-reader}
subjects: [{kind: ServiceAccount, name: reader}]
)");
  apply("reader.yaml", withPaths(R"yaml(apiVersion: v1
kind: Pod
metadata: {name: reader}
spec:
  terminationGracePeriodSeconds: 5
  serviceAccountName: reader
  containers:
  - name: c
    image: tandem
    command: [/bin/sh, -c]
    args:
    - |
      echo "mode=$(cat @MNT@/settings/mode) password=$(cat @MNT@/creds/password) env=$MODE,$PW,$cfg_mode"
      echo scratch > @MNT@/scratch/f && echo "scratch=$(cat @MNT@/scratch/f)"
      echo "host=$(cat @MNT@/host/marker)"
      echo "namespace=$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)"
      touch @MNT@/settings/x 2>/dev/null && echo settings-writable || echo settings-read-only
      echo "refused: $(HOME=/tmp kubectl get secret creds -o name 2>&1)"
      echo "in-cluster: $(HOME=/tmp kubectl get service kubernetes -o name 2>&1)"
      while true; do echo "now mode=$(cat @MNT@/settings/mode)"; sleep 1; done
    env:
    - {name: MODE, valueFrom: {configMapKeyRef: {name: settings, key: mode}}}
    - {name: PW, valueFrom: {secretKeyRef: {name: creds, key: password}}}
    envFrom: [{configMapRef: {name: settings}, prefix: cfg_}]
    volumeMounts:
    - {name: settings, mountPath: @MNT@/settings}
    - {name: creds, mountPath: @MNT@/creds}
    - {name: scratch, mountPath: @MNT@/scratch}
    - {name: host, mountPath: @MNT@/host, readOnly: true}
  volumes:
  - {name: settings, configMap: {name: settings}}
  - {name: creds, secret: {secretName: creds}}
  - {name: scratch, emptyDir: {}}
  - {name: host, hostPath: {path: @DIR@/hostdir, type: Directory}}
)yaml"));
  ASSERT_TRUE(eventually([&] { return kubectl("logs reader").output.find("in-cluster:") != std::string::npos; }, 40))
      << kubectl("get pod reader -o yaml").output << kubeletLog();
  const std::string logs = kubectl("logs reader").output;
  EXPECT_THAT(logs, HasSubstr("mode=fast password=s3cret env=fast,s3cret,fast"));
  EXPECT_THAT(logs, HasSubstr("scratch=scratch"));
  EXPECT_THAT(logs, HasSubstr("host=from-the-node"));
  EXPECT_THAT(logs, HasSubstr("namespace=default"));
  EXPECT_THAT(logs, HasSubstr("settings-read-only"));
  EXPECT_THAT(logs, HasSubstr("in-cluster: service/kubernetes")) << "kubectl in the pod, with only the pod's "
                                                                      "service account and the kubernetes Service";
  EXPECT_THAT(logs, HasSubstr("refused: Error from server (Forbidden): secrets \"creds\" is forbidden: User "
                              "\"system:serviceaccount:default:reader\" cannot get resource \"secrets\""))
      << "the pod's token is its service account's, with only what its Role grants";
  // The mounts are the pod's own: the host sees an empty mount point.
  EXPECT_FALSE(std::filesystem::exists(mnt + "/settings/mode"));

  // A changed ConfigMap reaches the running pod.
  ASSERT_EQ(kubectl("patch configmap settings -p '{\"data\":{\"mode\":\"slow\"}}'").rc, 0);
  EXPECT_TRUE(eventually([&] { return kubectl("logs reader --tail=1").output.find("now mode=slow") != std::string::npos; }, 30))
      << kubectl("logs reader --tail=3").output;

  // A pod whose ConfigMap does not exist yet waits for it, saying so.
  apply("waiter.yaml", withPaths(R"(apiVersion: v1
kind: Pod
metadata: {name: waiter}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: tandem, command: [/bin/sh, -c, "cat @MNT@/later/k; sleep 1000"],
     volumeMounts: [{name: later, mountPath: @MNT@/later}]}
  volumes: [{name: later, configMap: {name: later}}]
)"));
  ASSERT_TRUE(eventually([&] { return kubectl("get events").output.find("configmap \"later\" not found") != std::string::npos; }))
      << kubectl("get events").output;
  EXPECT_EQ(get("pod waiter", "{.status.phase}"), "Pending");
  EXPECT_THAT(kubectl("get events").output, HasSubstr("FailedMount"));
  apply("later.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: later}\ndata: {k: v}\n");
  EXPECT_TRUE(eventually([&] { return get("pod waiter", "{.status.phase}") == "Running"; }, 30)) << kubeletLog();

  auto del = kubectl("delete pod reader waiter --timeout=30s");
  EXPECT_EQ(del.rc, 0) << del.output;
  stopKubelet(SIGTERM);
  EXPECT_FALSE(std::filesystem::exists(mnt)) << "the kubelet removes the mount points it created";
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/hostdir/marker"));
}

TEST_F(KubeletTest, APreStopHookRunsBeforeTheContainerIsStopped) {
  apply("hooked.yaml", R"(apiVersion: v1
kind: Pod
metadata: {name: hooked}
spec:
  terminationGracePeriodSeconds: 10
  containers:
  - name: web
    image: tandem
    command: [/bin/sh, -c, "trap 'echo got SIGTERM; exit 0' TERM; /usr/bin/python3 -m http.server 8000 --bind 0.0.0.0 & wait"]
    ports: [{name: http, containerPort: 8000}]
    readinessProbe: {httpGet: {path: /, port: http}, periodSeconds: 1}
    lifecycle: {preStop: {httpGet: {path: "/?about-to-stop", port: http}}}
)");
  ASSERT_TRUE(eventually([&] { return get("pod hooked", "{.status.conditions[?(@.type==\"Ready\")].status}") == "True"; }))
      << kubectl("get pod hooked -o yaml").output << kubeletLog();
  auto del = kubectl("delete pod hooked --timeout=30s");
  ASSERT_EQ(del.rc, 0) << del.output;
  const std::string log = readFile(dir_ + "/kubelet/pods/default/hooked/web.log");
  const size_t hook = log.find("GET /?about-to-stop"), term = log.find("got SIGTERM");
  ASSERT_NE(hook, std::string::npos) << log;
  ASSERT_NE(term, std::string::npos) << log;
  EXPECT_LT(hook, term) << "the hook ran before SIGTERM";
  EXPECT_THAT(kubectl("get events").output, ::testing::Not(HasSubstr("FailedPreStopHook")));
}

// Agents in pods find each other as they would under the operator: the
// router its decode and prefill workers, D its prefill agents, from the
// EndpointSlices of headless Services, with the pods' own service accounts.
TEST_F(KubeletApiAccessTest, AgentsInPodsDiscoverEachOtherServeThroughTheRouterServiceAndDrainOnScaleDown) {
  const std::string model = dir_ + "/model";
  ASSERT_EQ(shell(std::string(std::getenv("TANDEM_BIN_DIR")) + "/tandem-make-model --out " + model).rc, 0);
  // The decode agent's grace (and drain) leaves its stream time to finish
  // even under ASan, where decoding is many times slower.
  auto agent = [&](const std::string& name, const std::string& role, const std::string& extra, int port) {
    return "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: " + name + "}\nspec:\n  replicas: 1\n" +
           "  selector: {matchLabels: {app: " + name + "}}\n  template:\n    metadata: {labels: {app: " + name +
           "}}\n    spec:\n      serviceAccountName: e2e-agent\n      terminationGracePeriodSeconds: 180\n" +
           "      containers:\n      - name: agent\n" +
           "        image: tandem\n        env: [{name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]\n" +
           "        command: [tandem-agent]\n        args: [--role, " + role + ", --model-dir, " + model +
           ", --listen, '0.0.0.0:" + std::to_string(port) + "', --pool, e2e" + extra + "]\n" +
           "        ports: [{name: http, containerPort: " + std::to_string(port) + "}, {name: kv, containerPort: 8200}]\n" +
           "        readinessProbe: {httpGet: {path: /readyz, port: " + std::to_string(port) + "}, periodSeconds: 1}\n";
  };
  // Headless Services name the ports discovery looks for.
  auto headless = [](const std::string& name) {
    return "---\napiVersion: v1\nkind: Service\nmetadata: {name: " + name + "}\nspec:\n  clusterIP: None\n" +
           "  selector: {app: " + name + "}\n  ports: [{name: http, port: 8100}, {name: kv, port: 8200}]\n";
  };
  auto podIps = [&](const std::string& app) { return get("pods -l app=" + app, "{.items[*].status.podIP}"); };
  const std::string kv = ", --kv-listen, '$(POD_IP):8200', --kv-tls, 'posix,cma,tcp'";
  // What the operator gives a pool's agents: discovery, and nothing else.
  apply("rbac.yaml", R"(apiVersion: v1
kind: ServiceAccount
metadata: {name: e2e-agent}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: e2e-discovery}
rules: [{apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: e2e-discovery}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: e2e-discovery}
subjects: [{kind: ServiceAccount, name: e2e-agent, namespace: default}]
)");
  apply("prefill.yaml", agent("prefill", "prefill", kv, 8100) + headless("prefill"));
  apply("decode.yaml", agent("decode", "decode", kv + ", --prefill-service, prefill, --drain-grace, 180s", 8100) +
                           headless("decode"));
  apply("router.yaml", agent("router", "router", ", --decode-service, decode, --prefill-service, prefill", 8000) +
                           "---\napiVersion: v1\nkind: Service\nmetadata: {name: router}\nspec:\n"
                           "  selector: {app: router}\n  ports: [{port: 80, targetPort: 8000}]\n");
  for (const char* d : {"prefill", "decode", "router"}) {
    ASSERT_EQ(kubectl(std::string("rollout status deploy/") + d + " --timeout=90s").rc, 0)
        << d << kubectl(std::string("logs deploy/") + d).output << kubeletLog();
  }
  const std::string p_ip = podIps("prefill"), d_ip = podIps("decode");
  const std::string router = get("svc router", "{.spec.clusterIP}");
  ASSERT_TRUE(eventually([&] {
    return get("endpointslices -l kubernetes.io/service-name=router", "{.items[0].endpoints[0].conditions.ready}") ==
           "true";
  }));

  // D is Ready before its discovery has found P's endpoint (it serves
  // meanwhile, computing prompts itself): the request below is to take the
  // P/D path, so it waits for D to have P.
  ASSERT_TRUE(eventually([&] {
    return kubectl("logs deploy/decode").output.find("prefill agent joined the directory") != std::string::npos;
  }, 60)) << kubectl("logs deploy/decode").output << kubectl("get endpointslices -o yaml").output;
  const std::string body =
      R"({"model":"model","prompt":"a prompt long enough to be prefilled on the prefill agent in its own pod","max_tokens":8})";
  auto r = shell("curl -s -m 60 http://" + router + ":80/v1/completions -H 'Content-Type: application/json' -d '" + body + "'");
  EXPECT_THAT(r.output, HasSubstr("\"choices\"")) << r.output << kubectl("logs deploy/decode").output
                                                    << kubectl("logs deploy/router").output;
  const std::string metrics = shell("curl -s -m 5 http://" + d_ip + ":8100/metrics").output;
  EXPECT_THAT(metrics, ::testing::ContainsRegex("tandem_request_path_total\\{[^}]*path=\"disagg\"[^}]*\\} [1-9]"))
      << "D pulled the KV from P's pod, found through the prefill Service";
  EXPECT_THAT(kubectl("logs deploy/decode").output, HasSubstr("prefill agent joined the directory"));

  // A second decode pod joins the router's set.
  const std::string first_decode = get("pods -l app=decode", "{.items[0].metadata.name}");
  ASSERT_EQ(kubectl("scale deploy/decode --replicas=2").rc, 0);
  ASSERT_EQ(kubectl("rollout status deploy/decode --timeout=90s").rc, 0) << kubeletLog();
  std::string second;
  std::istringstream pods(get("pods -l app=decode", "{.items[*].metadata.name}"));
  for (std::string name; pods >> name;) {
    if (name != first_decode) second = name;
  }
  ASSERT_FALSE(second.empty());
  auto routerMetrics = [&] { return shell("curl -s -m 5 http://" + router + ":80/metrics").output; };
  auto routes = [&](const std::string& worker) {
    return std::regex_search(routerMetrics(), std::regex("tandem_router_worker_sessions\\{[^}]*worker=\"" + worker + "\""));
  };
  EXPECT_TRUE(eventually([&] { return routes(first_decode) && routes(second); }, 30)) << routerMetrics();
  ASSERT_EQ(kubectl("scale deploy/decode --replicas=1").rc, 0);
  ASSERT_TRUE(eventually([&] { return podIps("decode").find(' ') == std::string::npos; }, 60));
  const std::string d_left = podIps("decode");

  // Scale D away while it streams: the stream ends with [DONE] before the
  // process does, and the router drops it from its set.
  const std::string stream_body = R"({"model":"model","prompt":"drain","max_tokens":1500,"ignore_eos":true,"stream":true})";
  std::string streamed;
  std::thread client([&] {
    streamed = shell("curl -s -N -m 240 http://" + d_left + ":8100/v1/completions -H 'Content-Type: application/json' -d '" +
                     stream_body + "'")
                   .output;
  });
  ASSERT_TRUE(eventually([&] {
    return std::regex_search(shell("curl -s -m 5 http://" + d_left + ":8100/metrics").output,
                             std::regex("tandem_requests_running\\{[^}]*\\} [1-9]"));
  })) << "the stream never started";
  ASSERT_EQ(kubectl("scale deploy/decode --replicas=0").rc, 0);
  EXPECT_TRUE(eventually([&] { return routerMetrics().find("tandem_router_worker_sessions{") == std::string::npos; }, 30))
      << "the terminating decode pod left the router's set while it drained: " << routerMetrics();
  client.join();
  EXPECT_TRUE(streamed.find("data: [DONE]") != std::string::npos)
      << "the stream was cut; its end: " << streamed.substr(streamed.size() > 300 ? streamed.size() - 300 : 0);
  EXPECT_TRUE(eventually([&] { return get("pods -l app=decode", "{.items[*].metadata.name}").empty(); }));
  (void)p_ip;
}

// examples/local/tiny.yaml, what `./tandem up` applies, serves as written.
TEST_F(KubeletApiAccessTest, TheLocalExampleServesAChatCompletionThroughItsRouterService) {
  const std::string model = dir_ + "/model";
  ASSERT_EQ(shell(std::string(std::getenv("TANDEM_BIN_DIR")) + "/tandem-make-model --out " + model).rc, 0);
  const std::string manifest = std::regex_replace(readFile(std::string(TANDEM_SOURCE_DIR) + "/examples/local/tiny.yaml"),
                                                  std::regex("TANDEM_MODEL_DIR"), model);
  apply("tiny.yaml", manifest);
  for (const char* d : {"tiny-prefill", "tiny-decode", "tiny-router"}) {
    ASSERT_EQ(kubectl(std::string("rollout status deploy/") + d + " --timeout=90s").rc, 0)
        << d << kubectl("get pods -o wide").output << kubectl("get events").output << kubeletLog();
  }
  const std::string router = get("svc tiny", "{.spec.clusterIP}");
  const std::string body = R"({"model":"tiny","messages":[{"role":"user","content":"Hello from the example"}],"max_tokens":8})";
  auto r = shell("curl -s -m 60 http://" + router + ":8000/v1/chat/completions -H 'Content-Type: application/json' -d '" +
                 body + "'");
  EXPECT_THAT(r.output, HasSubstr("\"chat.completion\"")) << r.output << kubectl("logs deploy/tiny-router").output;
  // Both decode agents are in the router's set, found through tiny-decode.
  auto decodeWorkers = [&] {
    const std::string m = shell("curl -s -m 5 http://" + router + ":8000/metrics").output;
    const std::regex series("tandem_router_worker_sessions\\{[^}]*worker=\"tiny-decode-");
    return std::distance(std::sregex_iterator(m.begin(), m.end(), series), std::sregex_iterator());
  };
  EXPECT_TRUE(eventually([&] { return decodeWorkers() == 2; })) << decodeWorkers();
  auto del = kubectl("delete -f " + dir_ + "/tiny.yaml --timeout=60s");
  EXPECT_EQ(del.rc, 0) << del.output;
}

class KubeletGpuNodesTest : public KubeletTest {
 protected:
  void SetUp() override {
    nodes_ = {"cpu-a cpu=8 memory=16Gi", "gpu-a cpu=32 memory=64Gi nvidia.com/gpu=2 label:pool=gpu taint:gpu=true:NoSchedule"};
    KubeletTest::SetUp();
  }
};

TEST_F(KubeletGpuNodesTest, APodThatFitsNowhereStaysPendingAsUnschedulable) {
  apply("gpu.yaml", R"(apiVersion: v1
kind: Pod
metadata: {name: greedy}
spec:
  containers:
  - name: c
    image: tandem
    command: [/bin/sleep, "100"]
    resources: {limits: {nvidia.com/gpu: 1}}
)");
  ASSERT_TRUE(eventually([&] {
    return get("pod greedy", "{.status.conditions[?(@.type==\"PodScheduled\")].reason}") == "Unschedulable";
  })) << kubectl("get pod greedy -o yaml").output;
  EXPECT_EQ(get("pod greedy", "{.status.phase}"), "Pending");
  EXPECT_EQ(get("pod greedy", "{.status.conditions[?(@.type==\"PodScheduled\")].message}"),
            "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint {gpu: true}.");
  EXPECT_THAT(kubectl("get events").output, HasSubstr("FailedScheduling"));

  // Tolerating the taint, it fits the GPU node; a third GPU does not.
  apply("gpu2.yaml", R"(apiVersion: v1
kind: Pod
metadata: {name: tolerant}
spec:
  tolerations: [{key: gpu, operator: Exists}]
  nodeSelector: {pool: gpu}
  containers:
  - name: c
    image: tandem
    command: [/bin/sleep, "100"]
    resources: {limits: {nvidia.com/gpu: 2}}
)");
  ASSERT_TRUE(eventually([&] { return get("pod tolerant", "{.status.phase}") == "Running"; })) << kubeletLog();
  EXPECT_EQ(get("pod tolerant", "{.spec.nodeName}"), "gpu-a");
  auto del = kubectl("delete pod tolerant greedy --timeout=20s");
  EXPECT_EQ(del.rc, 0) << del.output;
}

class KubeletFlagsTest : public ApiServerFixture {
 protected:
  void SetUp() override {}  // no API server: the flags are refused before it is needed
  void TearDown() override {}
};

TEST_F(KubeletFlagsTest, ABadNetnsPrefixIsRefusedByName) {
  const std::string exe = std::string(std::getenv("TANDEM_BIN_DIR")) + "/tandem-kubelet";
  for (const char* bad : {"'Bad/Name'", "''"}) {
    const CommandResult r = shell(exe + " --kubeconfig /nonexistent --netns-prefix " + bad);
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_THAT(r.output, HasSubstr("--netns-prefix")) << r.output;
    EXPECT_THAT(r.output, HasSubstr("lower-case letters")) << r.output;
  }
}

TEST_F(KubeletTest, AKubeletKilledWithSigkillLeavesNothingOnceRestartedAndThePodsConverge) {
  apply("web.yaml", kWebPod);
  ASSERT_TRUE(eventually([&] { return get("pod web", "{.status.phase}") == "Running"; })) << kubeletLog();
  const std::string first = get("pod web", "{.status.containerStatuses[0].containerID}");
  const int pid = std::stoi(std::regex_replace(first, std::regex("process://"), ""));
  stopKubelet(SIGKILL);
  EXPECT_EQ(kill(pid, 0), 0) << "a container outlives a killed kubelet (as on a real node)";
  startKubelet();
  EXPECT_TRUE(eventually([&] { return kill(pid, 0) != 0; })) << "the restarted kubelet left the old process running";
  ASSERT_TRUE(eventually([&] {
    const std::string now = get("pod web", "{.status.containerStatuses[0].containerID}");
    return !now.empty() && now != first && get("pod web", "{.status.conditions[?(@.type==\"Ready\")].status}") == "True";
  })) << kubectl("get pod web -o yaml").output << kubeletLog();
  const std::string ip = get("pod web", "{.status.podIP}");
  EXPECT_EQ(shell("curl -s -o /dev/null -w '%{http_code}' -m 5 http://" + ip + ":8000/").output, "200");
}

}  // namespace
}  // namespace tandem::e2e
