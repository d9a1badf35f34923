#include "agent/discovery.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "src/common/strings.h"
#include "src/k8s/client.h"
#include "src/k8s/config.h"
#include "src/k8s/informer.h"
#include "src/k8s/resource.h"

namespace tandem::agent {

using nlohmann::json;

std::vector<HostPort> readyEndpoints(const std::vector<json>& slices, std::string_view port_name) {
  std::vector<HostPort> out;
  for (const json& slice : slices) {
    int port = 0;
    for (const json& p : slice.value("ports", json::array())) {
      if (p.is_object() && p.value("name", "") == port_name && p.value("port", 0) > 0) port = p.value("port", 0);
    }
    if (port == 0) continue;
    for (const json& e : slice.value("endpoints", json::array())) {
      if (!e.is_object()) continue;
      const json conditions = e.value("conditions", json::object());
      const json ready = conditions.value("ready", json());
      const json terminating = conditions.value("terminating", json());
      if ((ready.is_boolean() && !ready.get<bool>()) || (terminating.is_boolean() && terminating.get<bool>())) continue;
      const json addresses = e.value("addresses", json::array());
      if (!addresses.is_array() || addresses.empty() || !addresses[0].is_string()) continue;
      out.push_back({addresses[0].get<std::string>(), port});
    }
  }
  const auto key = [](const HostPort& h) { return std::make_pair(h.host, h.port); };
  std::sort(out.begin(), out.end(), [&](const HostPort& a, const HostPort& b) { return key(a) < key(b); });
  out.erase(std::unique(out.begin(), out.end(), [&](const HostPort& a, const HostPort& b) { return key(a) == key(b); }),
            out.end());
  return out;
}

struct ServiceDiscovery::Follow {
  std::string service, port_name;
  OnChange on_change;
  std::unique_ptr<k8s::Informer> informer;
  std::mutex mu;  // one report at a time, in order
  std::optional<std::vector<HostPort>> last;

  void report() {
    std::lock_guard l(mu);
    std::vector<HostPort> now = readyEndpoints(informer->cache().list(), port_name);
    const auto same = [](const std::vector<HostPort>& a, const std::vector<HostPort>& b) {
      return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                        [](const HostPort& x, const HostPort& y) { return x.host == y.host && x.port == y.port; });
    };
    if (last && same(*last, now)) return;
    last = now;
    on_change(now);
  }
};

ServiceDiscovery::ServiceDiscovery(std::unique_ptr<k8s::Client> client, std::string ns)
    : client_(std::move(client)), ns_(std::move(ns)) {}

ServiceDiscovery::~ServiceDiscovery() {
  for (auto& f : follows_) f->informer->stop();
}

absl::StatusOr<std::unique_ptr<ServiceDiscovery>> ServiceDiscovery::connect(std::string ns) {
  absl::StatusOr<k8s::ClusterConfig> config = k8s::loadDefaultConfig();
  if (!config.ok()) {
    return absl::FailedPreconditionError(
        strCat("discovery needs the Kubernetes API (in a pod, or with KUBECONFIG): ", config.status().message()));
  }
  if (ns.empty()) {
    const char* pod_ns = std::getenv("POD_NAMESPACE");
    ns = pod_ns != nullptr && *pod_ns != '\0' ? pod_ns : config->defaultNamespace;
  }
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<k8s::Client> client, k8s::Client::create(*config));
  return std::unique_ptr<ServiceDiscovery>(new ServiceDiscovery(std::move(client), std::move(ns)));
}

absl::Status ServiceDiscovery::follow(const std::string& service, std::string port_name, OnChange on_change) {
  auto f = std::make_unique<Follow>();
  Follow* raw = f.get();
  f->service = service;
  f->port_name = std::move(port_name);
  f->on_change = std::move(on_change);
  f->informer = std::make_unique<k8s::Informer>(
      *client_, SystemClock::instance(),
      k8s::InformerOptions{.resource = k8s::endpointSlicesResource(),
                           .ns = ns_,
                           .labelSelector = strCat("kubernetes.io/service-name=", service),
                           .maxRetryDelay = std::chrono::seconds(5)},
      k8s::InformerHandlers::onAnyChange([raw](const json&) {
        if (raw->informer) raw->report();
      }));
  f->informer->start();
  if (f->informer->waitForSync(std::chrono::seconds(10))) {
    f->report();
  } else {
    log_.warn("the Service's EndpointSlices could not be listed yet; still trying",
              {{"service", strCat(ns_, "/", service)}});
  }
  log_.info("following a Service", {{"service", strCat(ns_, "/", service)}, {"port", raw->port_name}});
  follows_.push_back(std::move(f));
  return absl::OkStatus();
}

}  // namespace tandem::agent
