// ./tandem bench cluster: how long the local cluster (tandem-apiserver +
// tandem-kubelet, docs/local-cluster.md) takes to bring a stack up, against
// the same processes started directly in the same run.
//
//   apply_to_ready   `kubectl apply` of one prefill, two decode and one router
//                    Deployment (the built-in tiny model) until all four are
//                    available; yardstick: the four agents started at once as
//                    plain processes until each answers /readyz.
//   scale_to_ready   `kubectl scale` of a decode Deployment from 1 to 2 until
//                    the new pod is available; yardstick: one decode agent
//                    started as a plain process until it answers /readyz.
//
// The ratio is the cluster's overhead (scheduling, namespaces, probes every
// second, the controllers' round trips). The decode agents name the prefill
// agent by its ClusterIP, which carries HTTP but not UCX's connection set-up:
// readiness does not depend on KV moving, which this does not measure.
// Needs root (network namespaces) and kubectl.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_report.h"
#include "src/http/client.h"
#include "tests/testing/spawn.h"


namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

const std::string kBinDir = fs::read_symlink("/proc/self/exe").parent_path().string();

struct Child {
  pid_t pid = 0;
  ~Child() { stop(); }
  void stop() {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    pid = 0;
  }
};

bool spawn(Child& c, std::vector<std::string> args, const std::string& log) {
  c.pid = tandem::testutil::spawnLogged(std::move(args), log);
  if (c.pid > 0) return true;
  c.pid = 0;
  return false;
}

int run(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()); }

bool waitUntil(const std::function<bool()>& f, std::chrono::seconds limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The yardstick: `n` agents started at once as plain processes, until each answers /readyz.
double bareStart(const std::string& dir, const std::string& model, const std::vector<std::string>& roles) {
  std::vector<Child> agents(roles.size());
  const auto t0 = Clock::now();
  for (size_t i = 0; i < roles.size(); ++i) {
    const std::string port = std::to_string(18100 + i);
    std::vector<std::string> args = {kBinDir + "/tandem-agent", "--role", roles[i], "--model-dir", model,
                                     "--listen", "127.0.0.1:" + port, "--worker", "bare-" + std::to_string(i),
                                     "--log-level", "error"};
    if (roles[i] == "prefill" || roles[i] == "decode") {
      for (const char* a : {"--kv-listen", "127.0.0.1:0", "--kv-tls", "tcp"}) args.push_back(a);
    }
    if (roles[i] == "decode") {
      args.push_back("--prefill-peer");
      args.push_back("127.0.0.1:18299");
    }
    if (roles[i] == "router") {
      args.push_back("--decode-workers");
      args.push_back("127.0.0.1:18101,127.0.0.1:18102");
    }
    if (!spawn(agents[i], args, dir + "/bare.log")) return -1;
  }
  for (size_t i = 0; i < roles.size(); ++i) {
    const std::string url = "http://127.0.0.1:" + std::to_string(18100 + i) + "/readyz";
    if (!waitUntil([&] {
          auto r = tandem::http::httpGet(url, std::chrono::seconds(2));
          return r.ok() && r->status == 200;
        }, std::chrono::seconds(60))) {
      std::fprintf(stderr, "bench_cluster: the plain %s agent never became ready\n", roles[i].c_str());
      return -1;
    }
  }
  return secondsSince(t0);
}

std::string deployment(const std::string& name, const std::string& args) {
  return "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: " + name + "}\nspec:\n  replicas: 1\n"
         "  selector: {matchLabels: {app: " + name + "}}\n  template:\n    metadata: {labels: {app: " + name + "}}\n"
         "    spec:\n      containers:\n      - name: agent\n        image: tandem\n"
         "        command: [tandem-agent]\n        args: [" + args + "]\n"
         "        readinessProbe: {httpGet: {path: /readyz, port: http}, periodSeconds: 1}\n"
         "        ports: [{name: http, containerPort: " + (name == "router" ? "8000" : "8100") + "}]\n---\n";
}

std::string service(const std::string& name, const std::string& ip, int port) {
  return "apiVersion: v1\nkind: Service\nmetadata: {name: " + name + "}\nspec:\n  clusterIP: " + ip +
         "\n  selector: {app: " + name + "}\n  ports: [{name: http, port: " + std::to_string(port) +
         ", targetPort: http}]\n---\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (geteuid() != 0) {
    std::fprintf(stderr, "bench_cluster: needs root (the pod network's namespaces)\n");
    return 1;
  }
  char tmpl[] = "/tmp/tandem-bench-cluster-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  const std::string model = dir + "/tiny";
  if (run(kBinDir + "/tandem-make-model --out " + model) != 0) {
    std::fprintf(stderr, "bench_cluster: tandem-make-model failed\n");
    return 1;
  }
  const double bare_stack = bareStart(dir, model, {"prefill", "decode", "decode", "router"});
  const double bare_one = bareStart(dir, model, {"decode"});

  Child apiserver, kubelet;
  const std::string kubeconfig = dir + "/kubeconfig";
  spawn(apiserver, {kBinDir + "/tandem-apiserver", "--listen", "127.0.0.1:0", "--kubeconfig-out", kubeconfig,
                    "--port-file", dir + "/port", "--log-level", "warn"},
        dir + "/apiserver.log");
  if (!waitUntil([&] { return fs::exists(dir + "/port"); }, std::chrono::seconds(20))) return 1;
  spawn(kubelet,
        {kBinDir + "/tandem-kubelet", "--kubeconfig", kubeconfig, "--state-dir", dir + "/kubelet", "--bridge",
         "tndbench0", "--netns-prefix", "tndbench-", "--pod-cidr", "10.246.0.0/24", "--log-level", "warn"},
        dir + "/kubelet.log");
  const std::string kubectl = "kubectl --kubeconfig " + kubeconfig + " --cache-dir " + dir + "/cache ";
  if (!waitUntil([&] { return run(kubectl + "get node tandem-local") == 0; }, std::chrono::seconds(20))) {
    std::fprintf(stderr, "bench_cluster: the kubelet did not register its node (see %s/kubelet.log)\n", dir.c_str());
    return 1;
  }
  const std::string common = "--model-dir, " + model + ", --kv-tls, tcp, --kv-listen, '$(POD_IP):8200'";
  std::string manifest =
      service("prefill", "10.96.200.10", 8100) + service("decode-0", "10.96.200.20", 8100) +
      service("decode-1", "10.96.200.21", 8100) +
      deployment("prefill", "--role, prefill, --listen, '0.0.0.0:8100', " + common) +
      deployment("decode-0", "--role, decode, --listen, '0.0.0.0:8100', --prefill-peer, '10.96.200.10:8200', " + common) +
      deployment("decode-1", "--role, decode, --listen, '0.0.0.0:8100', --prefill-peer, '10.96.200.10:8200', " + common) +
      deployment("router", "--role, router, --listen, '0.0.0.0:8000', --model-dir, " + model +
                               ", --decode-workers, '10.96.200.20:8100,10.96.200.21:8100'");
  // POD_IP for the agents' KV listeners.
  const std::string env = "        env: [{name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]\n";
  for (size_t at = 0; (at = manifest.find("        command: [tandem-agent]", at)) != std::string::npos;
       at += env.size() + 1) {
    manifest.insert(at, env);
  }
  std::ofstream(dir + "/stack.yaml") << manifest;

  auto available = [&](const std::string& name, int want) {
    auto r = tandem::http::httpGet("http://127.0.0.1:" + std::to_string([&] {
                                     int p = 0;
                                     std::ifstream(dir + "/port") >> p;
                                     return p;
                                   }()) + "/apis/apps/v1/namespaces/default/deployments/" + name);
    if (!r.ok() || r->status != 200) return false;
    auto j = nlohmann::json::parse(r->body, nullptr, false);
    return !j.is_discarded() && j.value("/status/availableReplicas"_json_pointer, 0) == want &&
           j.value("/status/updatedReplicas"_json_pointer, 0) == want;
  };
  const auto t0 = Clock::now();
  if (run(kubectl + "apply -f " + dir + "/stack.yaml") != 0) {
    std::fprintf(stderr, "bench_cluster: kubectl apply failed\n");
    return 1;
  }
  bool up = waitUntil([&] {
    for (const char* d : {"prefill", "decode-0", "decode-1", "router"}) {
      if (!available(d, 1)) return false;
    }
    return true;
  }, std::chrono::seconds(120));
  const double apply_to_ready = up ? secondsSince(t0) : -1;
  double scale_to_ready = -1;
  if (up) {
    const auto t1 = Clock::now();
    if (run(kubectl + "scale deploy/decode-0 --replicas=2") == 0 &&
        waitUntil([&] { return available("decode-0", 2); }, std::chrono::seconds(120))) {
      scale_to_ready = secondsSince(t1);
    }
  }
  kubelet.stop();
  apiserver.stop();
  if (apply_to_ready < 0 || scale_to_ready < 0) {
    std::fprintf(stderr, "bench_cluster: the stack did not become available (see %s)\n", dir.c_str());
    return 1;
  }
  fs::remove_all(dir);
  std::vector<tandem::bench::Result> results = {
      {.name = "apply_to_ready_1p2d1r", .value = apply_to_ready, .unit = "s", .reference = bare_stack,
       .reference_name = "four plain agent processes started at once until /readyz"},
      {.name = "scale_to_ready_decode", .value = scale_to_ready, .unit = "s", .reference = bare_one,
       .reference_name = "one plain decode agent process until /readyz"},
  };
  return tandem::bench::writeReport("cluster", results, argc, argv);
}
