#include "e2e/kubelet/kubelet.h"
#include "e2e/kubelet/scrape_targets.h"

#include <arpa/inet.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_split.h"
#include "e2e/kubelet/pod_spec.h"
#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/k8s/resource.h"

namespace tandem::kubelet {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kScheduleKey = "schedule";
constexpr const char* kScrapeTargetsKey = "scrape-targets";

k8s::ResourceRef nodesResource() { return {"", "v1", "nodes", false}; }

std::string str(const json& j, const json::json_pointer& p) {
  return j.contains(p) && j.at(p).is_string() ? j.at(p).get<std::string>() : "";
}

std::string machineMemory() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  long long kb = 0;
  while (in >> key >> kb >> unit) {
    if (key == "MemTotal:") return strCat(kb, "Ki");
  }
  return "8Gi";
}

std::map<std::string, std::string> withMachineDefaults(std::map<std::string, std::string> capacity) {
  capacity.try_emplace("cpu", std::to_string(std::max(1u, std::thread::hardware_concurrency())));
  capacity.try_emplace("memory", machineMemory());
  capacity.try_emplace("pods", "110");
  return capacity;
}

bool terminal(const json& pod) {
  const std::string phase = str(pod, "/status/phase"_json_pointer);
  return phase == "Succeeded" || phase == "Failed";
}

}  // namespace

std::string defaultNodeName() { return "tandem-local"; }

absl::StatusOr<NodeSpec> parseNodeSpec(std::string_view text) {
  NodeSpec spec;
  std::vector<std::string> tokens = absl::StrSplit(std::string(text), ' ', absl::SkipEmpty());
  if (tokens.empty()) return absl::InvalidArgumentError("node: empty spec (expected NAME [RESOURCE=QUANTITY ...])");
  spec.name = tokens[0];
  for (char c : spec.name) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' ||
          c == '.')) {
      return absl::InvalidArgumentError(strCat("node \"", spec.name, "\": a name of lowercase letters, digits, '-', '.'"));
    }
  }
  for (size_t i = 1; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (t.starts_with("label:")) {
      std::vector<std::string> kv = absl::StrSplit(t.substr(6), absl::MaxSplits('=', 1));
      if (kv.size() != 2 || kv[0].empty()) {
        return absl::InvalidArgumentError(strCat("node ", spec.name, ": \"", t, "\" is not label:KEY=VALUE"));
      }
      spec.labels[kv[0]] = kv[1];
    } else if (t.starts_with("taint:")) {
      std::vector<std::string> parts = absl::StrSplit(t.substr(6), ':');
      std::vector<std::string> kv = absl::StrSplit(parts[0], absl::MaxSplits('=', 1));
      if (parts.size() != 2 || kv[0].empty() ||
          (parts[1] != "NoSchedule" && parts[1] != "PreferNoSchedule" && parts[1] != "NoExecute")) {
        return absl::InvalidArgumentError(strCat("node ", spec.name, ": \"", t,
                                                 "\" is not taint:KEY[=VALUE]:NoSchedule|PreferNoSchedule|NoExecute"));
      }
      spec.taints.push_back({kv[0], kv.size() == 2 ? kv[1] : "", parts[1]});
    } else {
      std::vector<std::string> kv = absl::StrSplit(t, absl::MaxSplits('=', 1));
      if (kv.size() != 2 || kv[0].empty()) {
        return absl::InvalidArgumentError(strCat("node ", spec.name, ": \"", t, "\" is not RESOURCE=QUANTITY"));
      }
      absl::StatusOr<int64_t> q = parseQuantityMilli(kv[1]);
      if (!q.ok()) return absl::InvalidArgumentError(strCat("node ", spec.name, ": ", kv[0], ": ", q.status().message()));
      spec.capacity[kv[0]] = kv[1];
    }
  }
  return spec;
}

Kubelet::Kubelet(k8s::Client& client, KubeletOptions options)
    : client_(client), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Kubelet>> Kubelet::start(k8s::Client& client, KubeletOptions options) {
  if (options.state_dir.empty()) return absl::InvalidArgumentError("kubelet: a state directory is required");
  if (options.nodes.empty()) options.nodes.push_back({.name = defaultNodeName()});
  for (auto& n : options.nodes) n.capacity = withMachineDefaults(std::move(n.capacity));
  options.network.state_file = (fs::path(options.state_dir) / "network.json").string();
  std::unique_ptr<Kubelet> k(new Kubelet(client, std::move(options)));
  TANDEM_RETURN_IF_ERROR(k->begin());
  return k;
}

absl::Status Kubelet::begin() {
  std::error_code ec;
  fs::create_directories(options_.state_dir, ec);
  if (ec) return absl::FailedPreconditionError(strCat("kubelet: cannot create ", options_.state_dir, ": ", ec.message()));
  records_ = std::make_unique<ProcessRecords>((fs::path(options_.state_dir) / "processes.json").string());
  TANDEM_ASSIGN_OR_RETURN(int killed, records_->killLeftovers());
  if (killed > 0) log_.warn("killed what a previous kubelet left running", {{"process_groups", killed}});
  // Mount points a previous kubelet created (no pod runs now).
  mounts_ = std::make_unique<MountPoints>((fs::path(options_.state_dir) / "mountpoints").string());
  mounts_->removeAll();
  TANDEM_ASSIGN_OR_RETURN(network_, PodNetwork::create(options_.network));
  if (!network_->usesNamespaces()) {
    log_.warn("no network namespaces here (not root?): each pod gets a 127.0.0.x address of its own instead");
  }
  events_ = std::make_unique<k8s::EventRecorder>(
      client_, k8s::EventRecorderOptions{.reportingController = "tandem.dev/kubelet",
                                         .reportingInstance = options_.nodes.front().name});
  http::Routes routes;
  routes.handlePrefix("GET", "/containerLogs/", [this](http::Request& req) { return serveLog(req); });
  TANDEM_ASSIGN_OR_RETURN(log_server_, http::Server::start({.host = options_.listen_host, .port = 0}, std::move(routes)));
  registerNodes();

  pods_ = std::make_unique<k8s::Informer>(client_, SystemClock::instance(),
                                          k8s::InformerOptions{.resource = k8s::podsResource()},
                                          k8s::InformerHandlers::onAnyChange([this](const json& p) {
                                            queue_.add(strCat("pod/", k8s::objectKey(p)));
                                            queue_.add(kScheduleKey);
                                            if (!options_.scrape_targets_file.empty()) queue_.add(kScrapeTargetsKey);
                                          }));
  nodes_ = std::make_unique<k8s::Informer>(
      client_, SystemClock::instance(), k8s::InformerOptions{.resource = nodesResource()},
      k8s::InformerHandlers::onAnyChange([this](const json&) { queue_.add(kScheduleKey); }));
  pods_->start();
  nodes_->start();
  if (!pods_->waitForSync(std::chrono::seconds(30)) || !nodes_->waitForSync(std::chrono::seconds(30))) {
    return absl::UnavailableError("kubelet: the API server's pods and nodes could not be listed within 30 s");
  }
  TANDEM_ASSIGN_OR_RETURN(proxy_,
                          ServiceProxy::start(client_, network_->usesNamespaces() ? options_.network.bridge : ""));
  if (network_->usesNamespaces()) publishApiService();
  worker_ = std::thread([this] { process(); });
  heartbeat_ = std::thread([this] {
    std::unique_lock l(stop_mu_);
    while (!stop_cv_.wait_for(l, options_.node_status_period, [&] { return stopped_; })) {
      l.unlock();
      registerNodes();
      l.lock();
    }
  });
  log_.info("kubelet started", {{"nodes", options_.nodes.size()}, {"log_port", log_server_->port()}});
  return absl::OkStatus();
}

Kubelet::~Kubelet() { stop(Duration::zero()); }

int Kubelet::logPort() const { return log_server_->port(); }

void Kubelet::stop(Duration grace) {
  {
    std::lock_guard l(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stop_cv_.notify_all();
  queue_.shutDown();
  if (worker_.joinable()) worker_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (pods_) pods_->stop();
  if (nodes_) nodes_->stop();
  if (proxy_) proxy_->stop();
  for (auto& [uid, w] : workers_) w->shutdown(grace);
  workers_.clear();  // joins each
  if (mounts_) mounts_->removeAll();
  if (log_server_) log_server_->shutdown(Duration::zero());
  if (network_) {
    absl::Status s = network_->teardown();
    if (!s.ok()) log_.warn("cannot remove the pod network", {{"error", std::string(s.message())}});
  }
}

// Creates the Nodes that do not exist (labels and taints from the options;
// once created they are the user's to change, as with kubectl label/taint)
// and writes their status: capacity, Ready, addresses, the log endpoint.
void Kubelet::registerNodes() {
  const std::string now = k8s::formatTime(SystemClock::instance().wallNow());
  for (const NodeSpec& n : options_.nodes) {
    // Ready since it last became so (the heartbeat moves only lastHeartbeatTime).
    std::string ready_since = now;
    if (nodes_) {
      if (auto cached = nodes_->cache().get("", n.name)) {
        for (const auto& c : cached->value("/status/conditions"_json_pointer, json::array())) {
          if (c.value("type", "") == "Ready" && c.value("status", "") == "True") {
            ready_since = c.value("lastTransitionTime", now);
          }
        }
      }
    }
    json labels = {{"kubernetes.io/hostname", n.name}, {"kubernetes.io/os", "linux"}, {"kubernetes.io/arch", "amd64"}};
    for (const auto& [k, v] : n.labels) labels[k] = v;
    json taints = json::array();
    for (const Taint& t : n.taints) {
      json j = {{"key", t.key}, {"effect", t.effect}};
      if (!t.value.empty()) j["value"] = t.value;
      taints.push_back(j);
    }
    json node = {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", n.name}, {"labels", labels}}},
                 {"spec", json::object()}};
    if (!taints.empty()) node["spec"]["taints"] = taints;
    auto created = client_.create(nodesResource(), "", node);
    if (!created.ok() && !absl::IsAlreadyExists(created.status())) {
      log_.warn("cannot register the node", {{"node", n.name}, {"error", std::string(created.status().message())}});
      continue;
    }
    json capacity = json::object();
    for (const auto& [k, v] : n.capacity) capacity[k] = v;
    json status = {
        {"capacity", capacity},
        {"allocatable", capacity},
        {"conditions",
         json::array({{{"type", "Ready"},
                       {"status", "True"},
                       {"reason", "KubeletReady"},
                       {"message", "tandem-kubelet is posting ready status"},
                       {"lastHeartbeatTime", now},
                       {"lastTransitionTime", ready_since}}})},
        {"addresses", json::array({{{"type", "InternalIP"}, {"address", options_.listen_host}},
                                   {{"type", "Hostname"}, {"address", n.name}}})},
        {"daemonEndpoints", {{"kubeletEndpoint", {{"Port", log_server_->port()}}}}},
        {"nodeInfo", {{"kubeletVersion", "v1.30.0-tandem"}, {"containerRuntimeVersion", "process://"},
                      {"operatingSystem", "linux"}, {"architecture", "amd64"}}}};
    auto r = client_.mergePatchStatus(nodesResource(), "", n.name, {{"status", status}});
    if (!r.ok()) log_.warn("cannot write the node's status", {{"node", n.name}, {"error", std::string(r.status().message())}});
  }
}

void Kubelet::process() {
  while (auto key = queue_.get()) {
    if (*key == kScheduleKey) {
      schedulePending();
    } else if (*key == kScrapeTargetsKey) {
      writeScrapeTargets();
    } else if (key->starts_with("pod/")) {
      syncPod(key->substr(4));
    }
    queue_.done(*key);
  }
}

// Binds every pending pod it can, oldest first; the others get
// PodScheduled=False with kube-scheduler's message, and are tried again
// when pods or nodes change and every reschedule_period.
void Kubelet::schedulePending() {
  std::vector<NodeInfo> nodes;
  for (const json& n : nodes_->cache().list()) {
    NodeInfo info;
    info.name = str(n, "/metadata/name"_json_pointer);
    const json allocatable = n.value("/status/allocatable"_json_pointer, json::object());
    const json labels = n.value("/metadata/labels"_json_pointer, json::object());
    for (const auto& [k, v] : allocatable.items()) {
      if (!v.is_string()) continue;
      if (auto q = parseQuantityMilli(v.get<std::string>()); q.ok()) info.allocatable[k] = *q;
    }
    for (const auto& [k, v] : labels.items()) {
      if (v.is_string()) info.labels[k] = v.get<std::string>();
    }
    for (const auto& t : n.value("/spec/taints"_json_pointer, json::array())) {
      info.taints.push_back({t.value("key", ""), t.value("value", ""), t.value("effect", "")});
    }
    info.unschedulable = n.value("/spec/unschedulable"_json_pointer, false);
    nodes.push_back(std::move(info));
  }
  std::map<std::string, std::map<std::string, int64_t>> bound;
  std::vector<json> pending;
  for (const json& p : pods_->cache().list()) {
    const std::string node = str(p, "/spec/nodeName"_json_pointer);
    if (node.empty()) {
      if (!p["metadata"].contains("deletionTimestamp") &&
          p["spec"].value("schedulerName", "default-scheduler") == "default-scheduler") {
        pending.push_back(p);
      }
      continue;
    }
    if (terminal(p)) continue;
    if (auto needs = podNeeds(p); needs.ok()) {
      for (const auto& [r, q] : needs->requests) bound[node][r] += q;
    }
  }
  std::sort(pending.begin(), pending.end(), [](const json& a, const json& b) {
    return std::make_pair(str(a, "/metadata/creationTimestamp"_json_pointer), k8s::objectKey(a)) <
           std::make_pair(str(b, "/metadata/creationTimestamp"_json_pointer), k8s::objectKey(b));
  });
  bool retry = false;
  std::set<std::string> still_pending;
  for (const json& p : pending) {
    const std::string key = k8s::objectKey(p);
    const std::string ns = str(p, "/metadata/namespace"_json_pointer);
    const std::string name = str(p, "/metadata/name"_json_pointer);
    std::string message;
    absl::StatusOr<PodNeeds> needs = podNeeds(p);
    if (!needs.ok()) {
      message = strCat("the pod's resources cannot be read: ", needs.status().message());
    } else {
      auto decision = schedule(*needs, nodes, bound);
      if (auto* node = std::get_if<std::string>(&decision)) {
        k8s::HttpRequest req;
        req.method = "POST";
        req.path = strCat("/api/v1/namespaces/", ns, "/pods/", name, "/binding");
        req.contentType = "application/json";
        req.body = json{{"apiVersion", "v1"},
                        {"kind", "Binding"},
                        {"metadata", {{"name", name}, {"namespace", ns}}},
                        {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", *node}}}}
                       .dump();
        auto r = client_.send(req);
        if (r.ok()) {
          for (const auto& [res, q] : needs->requests) bound[*node][res] += q;
          unschedulable_.erase(key);
          (void)events_->record(k8s::ObjectReference::of(p), k8s::EventType::kNormal, "Scheduled", "Binding",
                          strCat("Successfully assigned ", ns, "/", name, " to ", *node));
        } else if (!absl::IsNotFound(r.status()) && !absl::IsAborted(r.status())) {
          log_.warn("cannot bind the pod", {{"pod", key}, {"error", std::string(r.status().message())}});
          retry = true;
        }
        continue;
      }
      message = std::get<Unschedulable>(decision).message;
    }
    retry = true;
    still_pending.insert(key);
    if (auto it = unschedulable_.find(key); it != unschedulable_.end() && it->second == message) continue;
    json cond = {{"type", "PodScheduled"},
                 {"status", "False"},
                 {"reason", "Unschedulable"},
                 {"message", message},
                 {"lastProbeTime", nullptr},
                 {"lastTransitionTime", k8s::formatTime(SystemClock::instance().wallNow())}};
    auto r = client_.mergePatchStatus(k8s::podsResource(), ns, name, {{"status", {{"conditions", {cond}}}}});
    if (r.ok()) {
      unschedulable_[key] = message;
      (void)events_->record(k8s::ObjectReference::of(p), k8s::EventType::kWarning, "FailedScheduling", "Scheduling", message);
    }
  }
  // Forget the messages of pods no longer pending (bound or deleted).
  for (auto it = unschedulable_.begin(); it != unschedulable_.end();) {
    it = still_pending.contains(it->first) ? std::next(it) : unschedulable_.erase(it);
  }
  if (retry) queue_.addAfter(kScheduleKey, options_.reschedule_period);
}

// Starts a worker for a pod bound to one of this kubelet's nodes, passes
// it the newest object, tells it when the pod is gone, and forgets workers
// whose pod has stopped.
void Kubelet::syncPod(const std::string& key) {
  std::optional<json> pod = pods_->cache().getByKey(key);
  const std::string uid = pod ? str(*pod, "/metadata/uid"_json_pointer) : "";
  bool ours = false;
  if (pod) {
    const std::string node = str(*pod, "/spec/nodeName"_json_pointer);
    for (const auto& n : options_.nodes) ours = ours || n.name == node;
  }
  // Workers of this name: the current pod's, or an earlier pod's of the same name.
  bool busy = false;
  for (auto it = workers_.begin(); it != workers_.end();) {
    PodWorker& w = *it->second;
    if (w.key() != key) {
      ++it;
      continue;
    }
    if (it->first == uid && ours) {
      w.update(*pod);
    } else {
      w.apiDeleted();
    }
    if (w.finished()) {
      it = workers_.erase(it);
      continue;
    }
    if (it->first != uid) busy = true;
    ++it;
  }
  // A worker still stopping (its pod gone or replaced) is looked at again
  // until it has finished, so it is joined and forgotten.
  if (busy || (!workers_.empty() && (!pod || !ours))) {
    for (const auto& [id, w] : workers_) {
      if (w->key() == key) {
        queue_.addAfter(strCat("pod/", key), std::chrono::milliseconds(200));
        break;
      }
    }
  }
  if (!pod || !ours) return;
  if (!workers_.contains(uid) && terminal(*pod)) return;  // ran to completion (before a restart of the kubelet)
  if (pod->contains("/metadata/deletionTimestamp"_json_pointer) && !workers_.contains(uid)) {
    // Deleted before it ran here: nothing to stop.
    k8s::DeleteOptions o;
    o.gracePeriodSeconds = 0;
    o.preconditionUid = uid;
    auto r = client_.remove(k8s::podsResource(), str(*pod, "/metadata/namespace"_json_pointer),
                            str(*pod, "/metadata/name"_json_pointer), o);
    if (!r.ok() && !absl::IsNotFound(r.status()) && !absl::IsAborted(r.status())) {
      log_.warn("cannot delete a pod that never ran", {{"pod", key}, {"error", std::string(r.status().message())}});
      queue_.addRateLimited(strCat("pod/", key));
    }
    return;
  }
  if (busy) return;  // the earlier pod of this name still stops; looked at again above
  if (!workers_.contains(uid)) {
    workers_[uid] = std::make_unique<PodWorker>(
        PodWorkerEnv{.client = &client_,
                     .events = events_.get(),
                     .network = network_.get(),
                     .records = records_.get(),
                     .clock = &SystemClock::instance(),
                     .bin_dir = options_.bin_dir,
                     .pods_dir = (fs::path(options_.state_dir) / "pods").string(),
                     .host_ip = options_.listen_host,
                     .mounts = mounts_.get(),
                     .api_host = api_host_,
                     .api_port = api_port_,
                     .api_ca_pem = options_.api_ca_pem},
        *pod);
  }
  // A worker that finishes must be forgotten: look again shortly.
  queue_.addAfter(strCat("pod/", key), std::chrono::seconds(1));
}

// The API server as the `kubernetes` Service of the default namespace (a
// real API server maintains it itself): ClusterIP kApiServiceIp, port 443
// named https, and an EndpointSlice with the address the kubelet uses, so
// the Service proxy forwards pods' connections to it.
void Kubelet::writeScrapeTargets() {
  const std::string content = scrapeTargets(pods_->cache().list()).dump();
  if (content == scrape_targets_) return;
  absl::Status s = kubelet::writeScrapeTargets(options_.scrape_targets_file, nlohmann::json::parse(content));
  if (!s.ok()) {
    log_.warn("writing Prometheus' scrape targets failed", {{"error", std::string(s.message())}});
    return;
  }
  scrape_targets_ = content;
}

void Kubelet::publishApiService() {
  const std::string& url = options_.api_server;
  const auto refuse = [&](std::string_view why) {
    log_.warn(strCat("pods get no in-cluster API access: ", why), {{"server", url}});
  };
  if (url.rfind("https://", 0) != 0) return refuse("the API server is not served over https, which in-cluster clients require");
  std::string hostport = url.substr(8);
  hostport = hostport.substr(0, hostport.find('/'));
  const size_t colon = hostport.rfind(':');
  std::string host = colon == std::string::npos ? hostport : hostport.substr(0, colon);
  const std::string port = colon == std::string::npos ? "443" : hostport.substr(colon + 1);
  if (host == "localhost") host = "127.0.0.1";
  in_addr ignored{};
  if (inet_pton(AF_INET, host.c_str(), &ignored) != 1) return refuse("the API server's address is not an IPv4 address");
  const int port_number = std::atoi(port.c_str());
  const json service = {
      {"apiVersion", "v1"},
      {"kind", "Service"},
      {"metadata", {{"name", "kubernetes"}, {"namespace", "default"}, {"labels", {{"component", "apiserver"}, {"provider", "kubernetes"}}}}},
      {"spec",
       {{"clusterIP", kApiServiceIp},
        {"type", "ClusterIP"},
        {"ports", json::array({{{"name", "https"}, {"port", 443}, {"protocol", "TCP"}, {"targetPort", port_number}}})}}}};
  const json slice = {
      {"apiVersion", "discovery.k8s.io/v1"},
      {"kind", "EndpointSlice"},
      {"metadata",
       {{"name", "kubernetes"}, {"namespace", "default"}, {"labels", {{"kubernetes.io/service-name", "kubernetes"}}}}},
      {"addressType", "IPv4"},
      {"endpoints", json::array({{{"addresses", json::array({host})}, {"conditions", {{"ready", true}}}}})},
      {"ports", json::array({{{"name", "https"}, {"port", port_number}, {"protocol", "TCP"}}})}};
  const k8s::ApplyOptions apply{.fieldManager = "tandem-kubelet", .force = true};
  auto s1 = client_.apply(k8s::servicesResource(), "default", service, apply);
  auto s2 = s1.ok() ? client_.apply(k8s::endpointSlicesResource(), "default", slice, apply) : s1;
  if (!s2.ok()) return refuse(strCat("cannot publish the kubernetes Service: ", s2.status().message()));
  api_host_ = kApiServiceIp;
  api_port_ = "443";
  log_.info("pods reach the API server as the kubernetes Service", {{"address", strCat(kApiServiceIp, ":443")}, {"server", url}});
}

// GET /containerLogs/<ns>/<pod>/<container>[?previous=true&tailLines=N&limitBytes=N]
http::Response Kubelet::serveLog(http::Request& req) {
  std::vector<std::string> parts = absl::StrSplit(req.path().substr(std::string("/containerLogs/").size()), '/');
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty() || parts[2].empty()) {
    return http::Response::text(400, "expected /containerLogs/<namespace>/<pod>/<container>");
  }
  for (const auto& p : parts) {
    if (p == "." || p == "..") return http::Response::text(400, "bad path");
  }
  const bool previous = req.query("previous").value_or("") == "true";
  const fs::path file =
      fs::path(options_.state_dir) / "pods" / parts[0] / parts[1] / (parts[2] + (previous ? ".log.previous" : ".log"));
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    if (previous) {
      return http::Response::text(
          400, strCat("previous terminated container \"", parts[2], "\" in pod \"", parts[1], "\" not found"));
    }
    return http::Response::text(
        400, strCat("container \"", parts[2], "\" in pod \"", parts[1], "\" has no log here (not started yet?)"));
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (auto tail = req.query("tailLines")) {
    long long n = std::atoll(tail->c_str());
    if (n >= 0) {
      // The last n lines: walk back over n line ends (the final one ends the last line).
      size_t start = text.size();
      size_t end = text.size() > 0 && text.back() == '\n' ? text.size() - 1 : text.size();
      for (long long i = 0; i < n; ++i) {
        const size_t nl = end == 0 ? std::string::npos : text.rfind('\n', end - 1);
        start = nl == std::string::npos ? 0 : nl + 1;
        if (nl == std::string::npos) break;
        end = nl;
      }
      text = text.substr(start);
    }
  }
  if (auto limit = req.query("limitBytes")) {
    long long n = std::atoll(limit->c_str());
    if (n > 0 && static_cast<size_t>(n) < text.size()) text.resize(static_cast<size_t>(n));
  }
  return http::Response::text(200, std::move(text));
}

}  // namespace tandem::kubelet
