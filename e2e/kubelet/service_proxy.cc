#include "e2e/kubelet/service_proxy.h"

#include <arpa/inet.h>

#include "e2e/kubelet/command.h"
#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/k8s/resource.h"

namespace tandem::kubelet {

using nlohmann::json;

namespace {


bool isIpv4(const std::string& ip) {
  in_addr a;
  return inet_pton(AF_INET, ip.c_str(), &a) == 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServiceProxy>> ServiceProxy::start(k8s::Client& client, std::string bridge) {
  std::unique_ptr<ServiceProxy> p(new ServiceProxy(client, std::move(bridge)));
  TANDEM_RETURN_IF_ERROR(p->begin());
  return p;
}

absl::Status ServiceProxy::begin() {
  if (bridge_.empty()) {
    log_.warn("Services' ClusterIPs are not served without network namespaces; reach pods by their IPs");
    return absl::OkStatus();
  }
  auto onService = [this](const json& svc) { queue_.add(k8s::objectKey(svc)); };
  auto onSlice = [this](const json& s) {
    const std::string svc = s.value("/metadata/labels/kubernetes.io~1service-name"_json_pointer, "");
    if (!svc.empty()) queue_.add(k8s::objectKey(k8s::objectNamespace(s), svc));
  };
  services_ = std::make_unique<k8s::Informer>(
      client_, SystemClock::instance(), k8s::InformerOptions{.resource = k8s::servicesResource()},
      k8s::InformerHandlers::onAnyChange(onService));
  slices_ = std::make_unique<k8s::Informer>(
      client_, SystemClock::instance(), k8s::InformerOptions{.resource = k8s::endpointSlicesResource()},
      k8s::InformerHandlers::onAnyChange(onSlice));
  services_->start();
  slices_->start();
  if (!services_->waitForSync(std::chrono::seconds(30)) || !slices_->waitForSync(std::chrono::seconds(30))) {
    return absl::UnavailableError("proxy: services and endpointslices could not be listed within 30 s");
  }
  worker_ = std::thread([this] {
    while (auto key = queue_.get()) {
      sync(*key);
      queue_.done(*key);
    }
  });
  return absl::OkStatus();
}

ServiceProxy::~ServiceProxy() { stop(); }

void ServiceProxy::stop() {
  if (stopped_) return;
  stopped_ = true;
  queue_.shutDown();
  if (worker_.joinable()) worker_.join();
  if (services_) services_->stop();
  if (slices_) slices_->stop();
  served_.clear();  // stops every proxy
  for (const std::string& ip : addresses_) (void)runCommand({"ip", "addr", "del", ip + "/32", "dev", bridge_});
  addresses_.clear();
}

void ServiceProxy::dropService(const std::string& key) {
  auto it = served_.find(key);
  if (it == served_.end()) return;
  const std::string ip = it->second.ip;
  served_.erase(it);
  for (const auto& [k, s] : served_) {
    if (s.ip == ip) return;  // still another Service's
  }
  if (addresses_.erase(ip) > 0) (void)runCommand({"ip", "addr", "del", ip + "/32", "dev", bridge_});
}

void ServiceProxy::sync(const std::string& key) {
  std::optional<json> svc = services_->cache().getByKey(key);
  const std::string ip = svc ? svc->value("/spec/clusterIP"_json_pointer, "") : "";
  if (!svc || !isIpv4(ip)) {
    dropService(key);
    return;
  }
  if (served_.contains(key) && served_[key].ip != ip) dropService(key);
  if (!addresses_.contains(ip)) {
    auto r = runCommand({"ip", "addr", "add", ip + "/32", "dev", bridge_});
    if (!r.ok() || (r->exit_code != 0 && r->output.find("File exists") == std::string::npos)) {
      log_.warn("cannot add the Service's ClusterIP to the bridge",
                {{"service", key}, {"ip", ip}, {"error", r.ok() ? r->output : std::string(r.status().message())}});
      queue_.addRateLimited(key);
      return;
    }
    addresses_.insert(ip);
  }
  Served& served = served_[key];
  served.ip = ip;
  // Ready endpoints per port name, from every slice of the Service.
  const auto [ns, name] = k8s::splitObjectKey(key);
  std::map<std::string, std::vector<Backend>> backends;
  for (const json& slice : slices_->cache().listByLabel("kubernetes.io/service-name", name)) {
    if (k8s::objectNamespace(slice) != ns) continue;
    for (const auto& port : slice.value("ports", json::array())) {
      for (const auto& e : slice.value("endpoints", json::array())) {
        if (!e.value("/conditions/ready"_json_pointer, true)) continue;
        for (const auto& a : e.value("addresses", json::array())) {
          backends[port.value("name", "")].push_back({a.get<std::string>(), port.value("port", 0)});
        }
      }
    }
  }
  std::set<std::string> wanted;
  for (const auto& sp : svc->value("/spec/ports"_json_pointer, json::array())) {
    if (sp.value("protocol", "TCP") != "TCP") continue;
    const int port = sp.value("port", 0);
    const std::string id = strCat(sp.value("name", ""), "/", port);
    wanted.insert(id);
    auto& proxy = served.ports[id];
    if (!proxy) {
      auto p = TcpProxy::start(ip, port);
      if (!p.ok()) {
        log_.warn("cannot serve the Service's port", {{"service", key}, {"error", std::string(p.status().message())}});
        served.ports.erase(id);
        queue_.addRateLimited(key);
        continue;
      }
      proxy = std::move(*p);
      log_.info("serving a Service", {{"service", key}, {"address", strCat(ip, ":", port)}});
    }
    proxy->setBackends(backends[sp.value("name", "")]);
  }
  for (auto it = served.ports.begin(); it != served.ports.end();) {
    it = wanted.contains(it->first) ? std::next(it) : served.ports.erase(it);
  }
}

}  // namespace tandem::kubelet
