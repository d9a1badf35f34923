#pragma once
// Discovery (docs/routing.md "Discovery"): the router's workers and a
// decode agent's prefill agents, read from the EndpointSlices of headless
// Services through the Kubernetes API (src/k8s informers), instead of
// fixed address lists. An endpoint counts while it is ready and not
// terminating, so a pod that is being deleted leaves the set before its
// process stops (its drain then finishes what it has).
//
//   TANDEM_ASSIGN_OR_RETURN(auto d, ServiceDiscovery::connect(""));
//   TANDEM_RETURN_IF_ERROR(d->follow("tiny-decode", "http", [&](const std::vector<HostPort>& ready) {...}));
//
// Credentials: $KUBECONFIG, else in-cluster (the pod's service account),
// else ~/.kube/config (k8s::loadDefaultConfig).
//
// Thread-safety: follow() from one thread; callbacks run on the informers'
// threads, one at a time per Service. The destructor stops them.

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "agent/agent_config.h"
#include "src/common/log.h"

namespace tandem::k8s {
class Client;
class Informer;
}  // namespace tandem::k8s

namespace tandem::agent {

// The addresses (with the port named `port_name`) of the endpoints of
// `slices` that are ready (an unset condition counts as ready, as
// Kubernetes defines it) and not terminating; sorted, without duplicates.
// Slices without that port contribute nothing.
std::vector<HostPort> readyEndpoints(const std::vector<nlohmann::json>& slices, std::string_view port_name);

class ServiceDiscovery {
 public:
  using OnChange = std::function<void(const std::vector<HostPort>& ready)>;

  // `ns` "" : the pod's namespace (the in-cluster namespace file, else
  // $POD_NAMESPACE, else "default"). An error says why no API server can be
  // reached (no kubeconfig, not in a pod).
  static absl::StatusOr<std::unique_ptr<ServiceDiscovery>> connect(std::string ns);
  ~ServiceDiscovery();
  ServiceDiscovery(const ServiceDiscovery&) = delete;
  ServiceDiscovery& operator=(const ServiceDiscovery&) = delete;

  // Follows Service `service`: `on_change` gets the ready endpoints once
  // the slices were first listed (waits up to 10 s for that; later lists
  // still arrive) and again whenever they change.
  absl::Status follow(const std::string& service, std::string port_name, OnChange on_change);
  const std::string& ns() const { return ns_; }

 private:
  struct Follow;
  ServiceDiscovery(std::unique_ptr<k8s::Client> client, std::string ns);
  std::unique_ptr<k8s::Client> client_;
  const std::string ns_;
  const Logger log_{"discovery"};
  std::vector<std::unique_ptr<Follow>> follows_;
};

}  // namespace tandem::agent
