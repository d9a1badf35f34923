// ./tandem bench operator: how fast tandem-operator turns a pool edit into
// its children, with 1, 50 and 500 pools in tandem-apiserver, and what the
// operator costs at 500 pools (docs/benchmarks.md).
//
//   reconcile_p50/p99_<N>_pools  a pool's spec.decode.replicas patched until
//                                its decode Deployment's spec.replicas follows,
//                                seen by a watch; yardstick: the same patch made
//                                on a Deployment directly until the watch sees
//                                it (the API server's own round trip)
//   operator_cpu_500_pools       the operator's CPU seconds per second while
//                                the 500-pool samples ran; yardstick: one core
//   operator_rss_500_pools       its resident memory then; yardstick: the
//                                emulator's, holding every object
//
// No kubelet: the children get no pods, so this measures the reconciler and
// the API round trips, not the pods. Target (issue 16): p99 < 1 s at 500 pools.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_report.h"
#include "src/common/clock.h"
#include "src/common/strings.h"
#include "src/k8s/client.h"
#include "src/k8s/config.h"
#include "src/k8s/informer.h"
#include "src/k8s/resource.h"
#include "tests/testing/spawn.h"


namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
namespace fs = std::filesystem;
using tandem::strCat;

const std::string kBinDir = fs::read_symlink("/proc/self/exe").parent_path().string();

void stop(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
}

// utime + stime of `pid`, in seconds.
double cpuSeconds(pid_t pid) {
  std::ifstream in(strCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; fields >> f; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(f);
    if (i == 15) break;
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double rssBytes(pid_t pid) {
  std::ifstream in(strCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024;
  }
  return 0;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

json pool(const std::string& name) {
  return {{"apiVersion", "serving.tandem.dev/v1alpha1"},
          {"kind", "InferencePool"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec", {{"model", {{"name", "tiny"}, {"path", "/models/tiny"}}}, {"decode", {{"replicas", 2}}}}}};
}

// Decode Deployments' replicas as a watch sees them, and a wait for one to reach a value.
class ReplicaWatch {
 public:
  explicit ReplicaWatch(tandem::k8s::Client& client)
      : informer_(client, tandem::SystemClock::instance(),
                  tandem::k8s::InformerOptions{.resource = tandem::k8s::deploymentsResource(), .ns = "default"},
                  tandem::k8s::InformerHandlers::onAnyChange([this](const json& d) { seen(d); })) {
    informer_.start();
    informer_.waitForSync(std::chrono::seconds(30));
  }
  ~ReplicaWatch() { informer_.stop(); }
  // Waits until Deployment `name` has spec.replicas == `want`; seconds since `from`, or -1.
  double waitFor(const std::string& name, int64_t want, SteadyClock::time_point from) {
    std::unique_lock l(mu_);
    if (!cv_.wait_for(l, std::chrono::seconds(30), [&] { return replicas_[name] == want; })) return -1;
    return std::chrono::duration<double>(at_[name] - from).count();
  }
  size_t count() {
    std::lock_guard l(mu_);
    return replicas_.size();
  }

 private:
  void seen(const json& d) {
    const std::string name = d.value("/metadata/name"_json_pointer, std::string());
    const int64_t r = d.value("/spec/replicas"_json_pointer, int64_t{-1});
    std::lock_guard l(mu_);
    if (replicas_[name] != r) at_[name] = SteadyClock::now();
    replicas_[name] = r;
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, int64_t> replicas_;
  std::map<std::string, SteadyClock::time_point> at_;
  tandem::k8s::Informer informer_;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = fs::temp_directory_path() / strCat("tandem-bench-operator-", getpid());
  fs::create_directories(dir);
  const std::string kubeconfig = dir + "/kubeconfig", port_file = dir + "/port";
  using tandem::testutil::spawnLogged;
  const pid_t apiserver = spawnLogged({kBinDir + "/tandem-apiserver", "--listen", "127.0.0.1:0", "--kubeconfig-out",
                                       kubeconfig, "--port-file", port_file, "--log-level", "warn"},
                                      dir + "/apiserver.log");
  for (int i = 0; i < 200 && !fs::exists(port_file); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto config = tandem::k8s::loadKubeconfig(kubeconfig);
  if (apiserver <= 0 || !config.ok()) {
    std::fprintf(stderr, "bench_operator: tandem-apiserver did not start (see %s)\n", dir.c_str());
    return 1;
  }
  auto client = tandem::k8s::Client::create(*config);
  if (!client.ok()) return 1;
  const std::string crd = (fs::path(kBinDir) / "../../crds/inferencepool.yaml").lexically_normal().string();
  if (std::system(strCat("kubectl --kubeconfig ", kubeconfig, " apply -f ", crd, " >/dev/null").c_str()) != 0) {
    std::fprintf(stderr, "bench_operator: cannot apply %s\n", crd.c_str());
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const tandem::k8s::ResourceRef pools{"serving.tandem.dev", "v1alpha1", "inferencepools", true};
  const pid_t op = spawnLogged({kBinDir + "/tandem-operator", "--kubeconfig", kubeconfig, "--leader-elect", "false",
                                "--listen", "127.0.0.1:18080", "--log-level", "warn"},
                               dir + "/operator.log");
  ReplicaWatch watch(**client);
  const auto fail = [&] {
    stop(op);
    stop(apiserver);
    return 1;
  };

  std::vector<tandem::bench::Result> results;
  std::mt19937 rng(7);
  int created = 0;
  std::map<int, int64_t> replicas;  // what each pool's decode replicas were last set to (2 when never)
  double cpu_per_s = 0, rss = 0;
  for (int n : {1, 50, 500}) {
    for (; created < n; ++created) {
      if (!(*client)->create(pools, "default", pool(strCat("p", created))).ok()) return fail();
    }
    // Every pool's Deployments exist before anything is timed.
    for (int i = 0; i < 6000 && watch.count() < static_cast<size_t>(3 * n); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (watch.count() < static_cast<size_t>(3 * n)) {
      std::fprintf(stderr, "bench_operator: the operator made %zu of %d Deployments in 10 minutes (see %s)\n",
                   watch.count(), 3 * n, dir.c_str());
      return fail();
    }
    std::vector<double> reconcile, direct;
    const int samples = n == 1 ? 30 : 100;
    const double cpu0 = cpuSeconds(op);
    const auto t0 = SteadyClock::now();
    for (int s = 0; s < samples; ++s) {
      const int i = static_cast<int>(rng() % static_cast<unsigned>(n));
      const int64_t want = replicas.count(i) && replicas[i] == 3 ? 2 : 3;
      replicas[i] = want;
      const auto began = SteadyClock::now();
      if (!(*client)->mergePatch(pools, "default", strCat("p", i), {{"spec", {{"decode", {{"replicas", want}}}}}}).ok()) {
        return fail();
      }
      const double took = watch.waitFor(strCat("p", i, "-decode"), want, began);
      if (took < 0) {
        auto d = (*client)->get(tandem::k8s::deploymentsResource(), "default", strCat("p", i, "-decode"));
        auto pl = (*client)->get(pools, "default", strCat("p", i));
        std::fprintf(stderr, "bench_operator: p%d-decode never reached %lld replicas (has: %s; pool: %s)\n", i,
                     static_cast<long long>(want), d.ok() ? (*d)["spec"].dump().substr(0, 80).c_str() : "none",
                     pl.ok() ? (*pl)["spec"]["decode"].dump().c_str() : "none");
        return fail();
      }
      reconcile.push_back(took);
    }
    const double elapsed = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    if (n == 500) {
      cpu_per_s = (cpuSeconds(op) - cpu0) / elapsed;
      rss = rssBytes(op);
    }
    // The yardstick: the same edit made on a Deployment directly (one the operator does not own).
    json bare = json::parse(R"({"apiVersion": "apps/v1", "kind": "Deployment",
      "metadata": {"name": "bare", "namespace": "default"},
      "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "bare"}},
               "template": {"metadata": {"labels": {"app": "bare"}},
                            "spec": {"containers": [{"name": "c", "image": "x"}]}}}})");
    (void)(*client)->create(tandem::k8s::deploymentsResource(), "default", bare);
    for (int s = 0; s < samples; ++s) {
      const int64_t want = 2 + s % 2;
      const auto began = SteadyClock::now();
      if (!(*client)->mergePatch(tandem::k8s::deploymentsResource(), "default", "bare", {{"spec", {{"replicas", want}}}}).ok()) {
        return fail();
      }
      const double took = watch.waitFor("bare", want, began);
      if (took >= 0) direct.push_back(took);
    }
    (void)(*client)->remove(tandem::k8s::deploymentsResource(), "default", "bare");
    for (auto [p, name] : {std::pair{0.5, "p50"}, std::pair{0.99, "p99"}}) {
      results.push_back({.name = strCat("reconcile_", name, "_", n, "_pools"),
                         .value = percentile(reconcile, p),
                         .unit = "s",
                         .reference = percentile(direct, p),
                         .reference_name = strCat("a direct Deployment patch seen by a watch, ", name)});
    }
  }
  results.push_back({.name = "operator_cpu_500_pools",
                     .value = cpu_per_s,
                     .unit = "cores",
                     .reference = 1,
                     .reference_name = "one core"});
  results.push_back({.name = "operator_rss_500_pools",
                     .value = rss,
                     .unit = "bytes",
                     .reference = rssBytes(apiserver),
                     .reference_name = "the API server's resident memory, holding every object"});
  stop(op);
  stop(apiserver);
  fs::remove_all(dir);
  return tandem::bench::writeReport("operator", results, argc, argv);
}
