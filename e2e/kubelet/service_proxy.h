#pragma once
// kube-proxy's part of tandem-kubelet (docs/local-cluster.md): every
// ClusterIP Service gets its `spec.clusterIP` as an address on the pod
// network's bridge (so the host and every pod reach it) and a TcpProxy per
// TCP port that forwards to the ready endpoints of the Service's
// EndpointSlices (the port matched by name, as kube-proxy does). Headless
// Services (clusterIP None) get nothing. In the loopback fallback (no
// namespaces) Services are not served, and the log says so once.
//
// Level-triggered: informers on services and endpointslices feed a queue of
// Service keys.

#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "e2e/kubelet/tcp_proxy.h"
#include "src/common/log.h"
#include "src/k8s/client.h"
#include "src/k8s/informer.h"
#include "src/k8s/work_queue.h"

namespace tandem::kubelet {

class ServiceProxy {
 public:
  // `bridge`: the interface ClusterIPs go on; empty: Services are not served.
  static absl::StatusOr<std::unique_ptr<ServiceProxy>> start(k8s::Client& client, std::string bridge);
  ~ServiceProxy();
  void stop();

 private:
  ServiceProxy(k8s::Client& client, std::string bridge) : client_(client), bridge_(std::move(bridge)) {}
  absl::Status begin();
  void sync(const std::string& key);
  void dropService(const std::string& key);

  k8s::Client& client_;
  const std::string bridge_;
  const Logger log_{"proxy"};
  k8s::WorkQueue queue_;
  std::unique_ptr<k8s::Informer> services_, slices_;
  std::thread worker_;
  // Worker thread only.
  struct Served {
    std::string ip;
    std::map<std::string, std::unique_ptr<TcpProxy>> ports;  // "<name>/<port>" -> proxy
  };
  std::map<std::string, Served> served_;  // by Service key
  std::set<std::string> addresses_;       // ClusterIPs added to the bridge
  bool stopped_ = false;
};

}  // namespace tandem::kubelet
