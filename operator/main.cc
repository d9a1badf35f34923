// tandem-operator: reconciles InferencePools (docs/operator.md).
//
//   tandem-operator [--kubeconfig FILE] [--namespace NS] [--listen HOST:PORT]
//                   [--leader-elect true|false] [--lease-namespace NS] [--lease-name NAME]
//                   [--identity ID] [--workers N] [--log-level L] [--prometheus-url URL]
//
// Credentials: --kubeconfig, else $KUBECONFIG, else in-cluster, else
// ~/.kube/config. Serves /healthz, /readyz and /metrics on --listen
// (0.0.0.0:8080). With leader election (the default) only the replica that
// holds the Lease reconciles; the others wait to take over. Runs until
// SIGTERM or SIGINT, then releases the Lease. --prometheus-url is where the
// planner reads signals for pools that do not name their own
// (spec.autoscaling.prometheusUrl).

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "operator/listener.h"
#include "operator/reconciler.h"
#include "src/common/log.h"
#include "src/common/strings.h"
#include "src/http/server.h"
#include "src/k8s/config.h"
#include "src/k8s/leader_election.h"
#include "src/metrics/text_serializer.h"

namespace {

struct Flags {
  std::string kubeconfig, ns, listen = "0.0.0.0:8080", lease_namespace, lease_name = "tandem-operator", identity;
  std::string prometheus_url;
  bool leader_elect = true;
  int workers = 2;
  std::string log_level = "info";
};

int usage(const std::string& why) {
  std::cerr << "tandem-operator: " << why << "\n"
            << "usage: tandem-operator [--kubeconfig FILE] [--namespace NS] [--listen HOST:PORT]\n"
               "  [--leader-elect true|false] [--lease-namespace NS] [--lease-name NAME] [--identity ID]\n"
               "  [--workers N] [--log-level L] [--prometheus-url URL]\n";
  return why == "help" ? 0 : 2;
}

std::optional<int> parseFlags(int argc, char** argv, Flags& f) {
  for (int i = 1; i < argc; ++i) {
    // --flag VALUE or --flag=VALUE (what manifests usually write).
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return usage("help");
    std::string v;
    if (const size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      v = flag.substr(eq + 1);
      flag.resize(eq);
    } else {
      if (i + 1 >= argc) return usage(tandem::strCat(flag, " needs a value"));
      v = argv[++i];
    }
    if (flag == "--kubeconfig") {
      f.kubeconfig = v;
    } else if (flag == "--namespace") {
      f.ns = v;
    } else if (flag == "--listen") {
      f.listen = v;
    } else if (flag == "--leader-elect") {
      if (v != "true" && v != "false") return usage("--leader-elect: expected true or false, got \"" + v + "\"");
      f.leader_elect = v == "true";
    } else if (flag == "--lease-namespace") {
      f.lease_namespace = v;
    } else if (flag == "--lease-name") {
      f.lease_name = v;
    } else if (flag == "--identity") {
      f.identity = v;
    } else if (flag == "--workers") {
      f.workers = std::atoi(v.c_str());
      if (f.workers < 1 || f.workers > 64) return usage("--workers: expected 1 to 64, got \"" + v + "\"");
    } else if (flag == "--log-level") {
      f.log_level = v;
    } else if (flag == "--prometheus-url") {
      if (!v.starts_with("http://") && !v.starts_with("https://")) {
        return usage("--prometheus-url: expected an http:// or https:// URL, got \"" + v + "\"");
      }
      f.prometheus_url = v;
    } else {
      return usage("unknown flag " + flag);
    }
  }
  const size_t colon = f.listen.rfind(':');
  if (colon == std::string::npos || std::atoi(f.listen.c_str() + colon + 1) <= 0) {
    return usage("--listen: expected HOST:PORT, got \"" + f.listen + "\"");
  }
  return std::nullopt;
}

// The reconciler while this replica leads. want() only records the wish
// (the elector calls it and must keep renewing); a thread of its own starts
// and stops the reconciler, which waits for its informers to list.
class Leadership {
 public:
  Leadership(tandem::k8s::Client& client, tandem::metrics::Registry& registry, tandem::op::ReconcilerOptions options)
      : client_(client), registry_(registry), options_(std::move(options)), thread_([this] { run(); }) {}
  ~Leadership() {
    {
      std::lock_guard l(mu_);
      exiting_ = true;
      want_ = false;
    }
    cv_.notify_all();
    thread_.join();
  }
  void want(bool lead) {
    {
      std::lock_guard l(mu_);
      want_ = lead;
    }
    cv_.notify_all();
  }
  bool leading() const { return leading_; }
  // Stops reconciling and returns once it has (before the Lease is released).
  void stopAndWait() {
    want(false);
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return reconciler_ == nullptr && !starting_; });
  }

 private:
  void run() {
    std::unique_lock l(mu_);
    while (true) {
      cv_.wait(l, [&] { return exiting_ || want_ != (reconciler_ != nullptr); });
      if (want_ && !reconciler_) {
        starting_ = true;
        l.unlock();
        auto r = tandem::op::Reconciler::start(client_, registry_, options_);
        l.lock();
        starting_ = false;
        cv_.notify_all();
        if (r.ok()) {
          reconciler_ = std::move(*r);
          leading_ = true;
        } else {
          log_.error("cannot start reconciling; trying again in 5 s", {{"error", std::string(r.status().message())}});
          cv_.wait_for(l, std::chrono::seconds(5), [&] { return exiting_ || !want_; });
        }
      } else if (!want_ && reconciler_) {
        std::unique_ptr<tandem::op::Reconciler> r = std::move(reconciler_);
        leading_ = false;
        l.unlock();
        r.reset();  // joins its workers
        l.lock();
        cv_.notify_all();
      }
      if (exiting_ && !reconciler_) return;
    }
  }

  tandem::k8s::Client& client_;
  tandem::metrics::Registry& registry_;
  const tandem::op::ReconcilerOptions options_;
  const tandem::Logger log_{"operator"};
  std::mutex mu_;
  std::condition_variable cv_;
  bool want_ = false, exiting_ = false, starting_ = false;
  std::unique_ptr<tandem::op::Reconciler> reconciler_;
  std::atomic<bool> leading_{false};
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Flags flags;
  if (auto rc = parseFlags(argc, argv, flags)) return *rc;
  if (auto s = tandem::configureLogging({.spec = flags.log_level}); !s.ok()) return usage(std::string(s.message()));
  tandem::Logger log("operator");

  auto config = flags.kubeconfig.empty() ? tandem::k8s::loadDefaultConfig() : tandem::k8s::loadKubeconfig(flags.kubeconfig);
  if (!config.ok()) {
    std::cerr << "tandem-operator: " << config.status().message() << "\n";
    return 1;
  }
  auto client = tandem::k8s::Client::create(*config);
  if (!client.ok()) {
    std::cerr << "tandem-operator: " << client.status().message() << "\n";
    return 1;
  }
  if (flags.identity.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    flags.identity = tandem::strCat(host, "-", getpid());
  }
  if (flags.lease_namespace.empty()) {
    const char* pod_ns = std::getenv("POD_NAMESPACE");
    flags.lease_namespace = pod_ns != nullptr && *pod_ns != '\0' ? pod_ns : config->defaultNamespace;
  }

  tandem::metrics::Registry registry;
  auto& leader_gauge = tandem::metrics::buildGauge()
                           .name("tandem_operator_leader")
                           .help("1 while this replica holds the operator's Lease and reconciles.")
                           .registerOn(registry)
                           .add({});
  Leadership leadership(**client, registry,
                        {.ns = flags.ns,
                         .workers = flags.workers,
                         .identity = flags.identity,
                         .autoscaler = {.prometheus_url = flags.prometheus_url}});

  tandem::http::Routes routes;
  routes.handle("GET", "/healthz", [](tandem::http::Request&) { return tandem::http::Response::text(200, "ok"); });
  routes.handle("GET", "/readyz", [](tandem::http::Request&) { return tandem::http::Response::text(200, "ok"); });
  routes.handle("GET", "/metrics", [&](tandem::http::Request&) {
    leader_gauge.set(leadership.leading() ? 1 : 0);
    return tandem::http::Response::text(200, tandem::metrics::serializeText(registry),
                                        std::string(tandem::metrics::kContentType));
  });
  const size_t colon = flags.listen.rfind(':');
  auto server = tandem::http::Server::start(
      tandem::op::operatorListenerOptions(flags.listen.substr(0, colon), std::atoi(flags.listen.c_str() + colon + 1)),
      std::move(routes));
  if (!server.ok()) {
    std::cerr << "tandem-operator: cannot serve " << flags.listen << ": " << server.status().message() << "\n";
    return 1;
  }

  std::unique_ptr<tandem::k8s::LeaderElector> elector;
  std::thread election;
  if (flags.leader_elect) {
    auto e = tandem::k8s::LeaderElector::create(
        **client, {.leaseNamespace = flags.lease_namespace,
                   .leaseName = flags.lease_name,
                   .identity = flags.identity,
                   .onStartedLeading = [&] { leadership.want(true); },
                   .onStoppedLeading = [&] { leadership.want(false); },
                   .onNewLeader = [&](const std::string& id) { log.info("operator leader", {{"identity", id}}); }});
    if (!e.ok()) {
      std::cerr << "tandem-operator: " << e.status().message() << "\n";
      return 1;
    }
    elector = std::move(*e);
    election = std::thread([&] { elector->run(); });
  } else {
    leadership.want(true);
  }
  log.info("serving", {{"listen", flags.listen},
                       {"identity", flags.identity},
                       {"leader_elect", flags.leader_elect ? "true" : "false"},
                       {"lease", tandem::strCat(flags.lease_namespace, "/", flags.lease_name)}});
  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  log.info("stopping", {{"signal", sig}});
  leadership.stopAndWait();
  if (elector) {
    elector->stop();  // releases the Lease: a standby takes over at once
    election.join();
  }
  (*server)->shutdown(std::chrono::seconds(1));
  return 0;
}
