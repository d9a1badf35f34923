#pragma once
// tandem-kubelet's node and pod roles (docs/local-cluster.md): it registers
// the simulated Nodes, schedules pending pods onto them (scheduler.h's
// decision, bound through pods/binding, PodScheduled=False Unschedulable
// with kube-scheduler's message and a FailedScheduling event when none
// fits), runs every pod bound to one of its nodes (a PodWorker each), and
// serves the containers' logs for pods/log.
//
// Level-triggered: informers on pods and nodes feed one work queue; a key
// is re-read from the cache when processed, so missed intermediate states
// do not matter.

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "e2e/kubelet/pod_network.h"
#include "e2e/kubelet/pod_worker.h"
#include "e2e/kubelet/process_records.h"
#include "e2e/kubelet/scheduler.h"
#include "e2e/kubelet/service_proxy.h"
#include "src/common/clock.h"
#include "src/http/server.h"
#include "src/k8s/client.h"
#include "src/k8s/event_recorder.h"
#include "src/k8s/informer.h"
#include "src/k8s/work_queue.h"

namespace tandem::kubelet {

// A simulated Node: "NAME [RESOURCE=QUANTITY ...] [label:KEY=VALUE ...]
// [taint:KEY=VALUE:EFFECT ...]", e.g. "gpu-a nvidia.com/gpu=8 cpu=32
// memory=256Gi rdma/ib=1 label:pool=gpu taint:gpu=true:NoSchedule".
// Resources not named default to the machine's cpu and memory and 110 pods.
struct NodeSpec {
  std::string name;
  std::map<std::string, std::string> capacity;  // resource -> quantity text
  std::map<std::string, std::string> labels;
  std::vector<Taint> taints;
};
// InvalidArgument naming the token for a bad spec.
absl::StatusOr<NodeSpec> parseNodeSpec(std::string_view text);

struct KubeletOptions {
  std::vector<NodeSpec> nodes;  // empty: one node named after defaultNodeName()
  std::string state_dir;        // required: the network's state, process records, pods' logs
  std::string bin_dir;          // the local build's binaries
  PodNetworkOptions network;    // its state_file is set under state_dir
  std::string listen_host = "127.0.0.1";  // the log endpoint (pods/log)
  Duration node_status_period = std::chrono::seconds(10);
  Duration reschedule_period = std::chrono::seconds(5);  // unschedulable pods are tried again this often
  // The API server as this kubelet reaches it (its kubeconfig's server URL
  // and CA): published to pods as the `kubernetes` Service (kApiServiceIp)
  // when it is https on an IP address, as in-cluster clients require.
  std::string api_server;
  std::string api_ca_pem;
  // Where to keep Prometheus' file_sd targets (e2e/kubelet/scrape_targets.h); "" : nowhere.
  std::string scrape_targets_file;
};

// The `kubernetes` Service's ClusterIP, as on a cluster with the default
// service CIDR (the emulator never hands it to another Service).
inline constexpr const char* kApiServiceIp = "10.96.0.1";

std::string defaultNodeName();  // "tandem-local"

class Kubelet {
 public:
  // Kills what a previous kubelet left (process records, network state),
  // sets up the network, registers the nodes and starts. `client` outlives it.
  static absl::StatusOr<std::unique_ptr<Kubelet>> start(k8s::Client& client, KubeletOptions options);
  // stop(0) if not stopped.
  ~Kubelet();
  // Stops every pod (containers within `grace`, at most each pod's own),
  // removes the network, and returns. The pods stay in the API server.
  void stop(Duration grace);

  int logPort() const;

 private:
  Kubelet(k8s::Client& client, KubeletOptions options);
  absl::Status begin();
  void process();
  void registerNodes();
  void schedulePending();
  void syncPod(const std::string& key);
  void publishApiService();
  void writeScrapeTargets();
  http::Response serveLog(http::Request& req);

  k8s::Client& client_;
  const KubeletOptions options_;
  const Logger log_{"kubelet"};
  std::unique_ptr<ProcessRecords> records_;
  std::unique_ptr<MountPoints> mounts_;
  std::string api_host_, api_port_;  // what pods get as KUBERNETES_SERVICE_HOST/PORT; empty: no API access
  std::unique_ptr<PodNetwork> network_;
  std::unique_ptr<k8s::EventRecorder> events_;
  std::unique_ptr<http::Server> log_server_;
  std::unique_ptr<ServiceProxy> proxy_;
  k8s::WorkQueue queue_;
  std::unique_ptr<k8s::Informer> pods_, nodes_;
  std::thread worker_, heartbeat_;
  std::map<std::string, std::unique_ptr<PodWorker>> workers_;  // by uid; worker_ thread only
  std::map<std::string, std::string> unschedulable_;           // pod key -> message written; worker_ thread only
  std::string scrape_targets_;                                 // the file's content last written; worker_ thread only
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopped_ = false;
};

}  // namespace tandem::kubelet
