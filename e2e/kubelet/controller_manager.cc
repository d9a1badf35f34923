#include "e2e/kubelet/controller_manager.h"

#include "e2e/kubelet/workloads.h"
#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/k8s/resource.h"

namespace tandem::kubelet {

using nlohmann::json;

namespace {

k8s::ResourceRef replicaSetsResource() { return {"apps", "v1", "replicasets", true}; }

constexpr Duration kExpectationTimeout = std::chrono::seconds(5);

}  // namespace

ControllerManager::ControllerManager(k8s::Client& client) : client_(client) {}

absl::StatusOr<std::unique_ptr<ControllerManager>> ControllerManager::start(k8s::Client& client) {
  std::unique_ptr<ControllerManager> m(new ControllerManager(client));
  TANDEM_RETURN_IF_ERROR(m->begin());
  return m;
}

void ControllerManager::enqueueOwner(const json& obj, const char* kind, const char* prefix) {
  for (const auto& r : obj.value("/metadata/ownerReferences"_json_pointer, json::array())) {
    if (r.value("controller", false) && r.value("kind", "") == kind) {
      queue_.add(strCat(prefix, k8s::objectKey(k8s::objectNamespace(obj), r.value("name", ""))));
    }
  }
}

absl::Status ControllerManager::begin() {
  events_ = std::make_unique<k8s::EventRecorder>(
      client_, k8s::EventRecorderOptions{.reportingController = "tandem.dev/controllers", .reportingInstance = "local"});
  auto onDeployment = [this](const json& d) { queue_.add(strCat("deploy/", k8s::objectKey(d))); };
  auto onReplicaSet = [this](const json& rs) {
    queue_.add(strCat("rs/", k8s::objectKey(rs)));
    enqueueOwner(rs, "Deployment", "deploy/");
  };
  auto onPod = [this](const json& p) {
    enqueueOwner(p, "ReplicaSet", "rs/");
    // The Services whose selector it matches (or matched: its labels may have changed).
    if (services_ == nullptr) return;
    for (const json& svc : services_->cache().listInNamespace(k8s::objectNamespace(p))) {
      queue_.add(strCat("svc/", k8s::objectKey(svc)));
    }
  };
  auto onService = [this](const json& svc) { queue_.add(strCat("svc/", k8s::objectKey(svc))); };
  auto onSlice = [this](const json& slice) {
    const std::string svc = slice.value("/metadata/labels/kubernetes.io~1service-name"_json_pointer, "");
    if (!svc.empty()) queue_.add(strCat("svc/", k8s::objectKey(k8s::objectNamespace(slice), svc)));
  };
  deployments_ = std::make_unique<k8s::Informer>(
      client_, SystemClock::instance(),
      k8s::InformerOptions{.resource = k8s::deploymentsResource(), .resyncPeriod = std::chrono::seconds(30)},
      k8s::InformerHandlers::onAnyChange(onDeployment));
  replicaSets_ = std::make_unique<k8s::Informer>(
      client_, SystemClock::instance(),
      k8s::InformerOptions{.resource = replicaSetsResource(), .resyncPeriod = std::chrono::seconds(30)},
      k8s::InformerHandlers::onAnyChange(onReplicaSet));
  pods_ = std::make_unique<k8s::Informer>(
      client_, SystemClock::instance(), k8s::InformerOptions{.resource = k8s::podsResource()},
      k8s::InformerHandlers::onAnyChange(onPod));
  services_ = std::make_unique<k8s::Informer>(
      client_, SystemClock::instance(),
      k8s::InformerOptions{.resource = k8s::servicesResource(), .resyncPeriod = std::chrono::seconds(30)},
      k8s::InformerHandlers::onAnyChange(onService));
  slices_ = std::make_unique<k8s::Informer>(
      client_, SystemClock::instance(),
      k8s::InformerOptions{.resource = k8s::endpointSlicesResource(),
                           .labelSelector = "endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io"},
      k8s::InformerHandlers::onAnyChange(onSlice));
  for (auto* i : informers()) i->start();
  for (auto* i : informers()) {
    if (!i->waitForSync(std::chrono::seconds(30))) {
      return absl::UnavailableError(
          "controllers: deployments, replicasets, pods, services and endpointslices could not be listed within 30 s");
    }
  }
  worker_ = std::thread([this] { process(); });
  return absl::OkStatus();
}

ControllerManager::~ControllerManager() { stop(); }

void ControllerManager::stop() {
  if (stopped_) return;
  stopped_ = true;
  queue_.shutDown();
  if (worker_.joinable()) worker_.join();
  for (auto* i : informers()) {
    if (i != nullptr) i->stop();
  }
}

void ControllerManager::process() {
  while (auto key = queue_.get()) {
    if (key->starts_with("rs/")) {
      syncReplicaSet(key->substr(3));
    } else if (key->starts_with("deploy/")) {
      syncDeployment(key->substr(7));
    } else if (key->starts_with("svc/")) {
      syncService(key->substr(4));
    }
    queue_.done(*key);
  }
}

void ControllerManager::syncReplicaSet(const std::string& key) {
  std::optional<json> rs = replicaSets_->cache().getByKey(key);
  if (!rs) {
    expectations_.erase(key);
    return;
  }
  const auto [ns, name] = k8s::splitObjectKey(key);
  const std::vector<json> pods = pods_->cache().listInNamespace(ns);
  ReplicaSetPlan plan = planReplicaSet(*rs, pods);
  const int active = static_cast<int>(plan.status["replicas"].get<int64_t>());
  if (auto e = expectations_.find(key); e != expectations_.end()) {
    if (active != e->second.active && SystemClock::instance().now() < e->second.until) {
      queue_.addAfter(strCat("rs/", key), std::chrono::milliseconds(100));  // our own writes are not seen yet
      return;
    }
    expectations_.erase(e);
  }
  const k8s::ObjectReference ref = k8s::ObjectReference::of(*rs);
  bool failed = false;
  for (int i = 0; i < plan.create; ++i) {
    auto r = client_.create(k8s::podsResource(), ns, podFromTemplate(*rs));
    if (!r.ok()) {
      failed = true;
      (void)events_->record(ref, k8s::EventType::kWarning, "FailedCreate", "Create",
                            strCat("Error creating: ", std::string(r.status().message())));
      break;
    }
    (void)events_->record(ref, k8s::EventType::kNormal, "SuccessfulCreate", "Create",
                          strCat("Created pod: ", k8s::objectName(*r)));
  }
  for (const std::string& pod : plan.remove) {
    auto r = client_.remove(k8s::podsResource(), ns, pod);
    if (!r.ok() && !absl::IsNotFound(r.status())) {
      failed = true;
      continue;
    }
    (void)events_->record(ref, k8s::EventType::kNormal, "SuccessfulDelete", "Delete", strCat("Deleted pod: ", pod));
  }
  if (plan.create > 0 || !plan.remove.empty()) {
    expectations_[key] = {static_cast<int>(rs->value("/spec/replicas"_json_pointer, int64_t{1})),
                          SystemClock::instance().now() + kExpectationTimeout};
  }
  const json current = rs->value("status", json::object());
  json merged = current;
  merged.update(plan.status);
  if (merged != current) {
    auto r = client_.mergePatchStatus(replicaSetsResource(), ns, name, {{"status", plan.status}});
    if (!r.ok() && !absl::IsNotFound(r.status())) failed = true;
  }
  if (failed) {
    queue_.addRateLimited(strCat("rs/", key));
  } else {
    queue_.forget(strCat("rs/", key));
  }
}

void ControllerManager::syncDeployment(const std::string& key) {
  std::optional<json> d = deployments_->cache().getByKey(key);
  if (!d || d->contains("/metadata/deletionTimestamp"_json_pointer)) return;
  const auto [ns, name] = k8s::splitObjectKey(key);
  const std::string uid = k8s::objectUid(*d);
  std::vector<json> owned;
  for (const json& rs : replicaSets_->cache().listInNamespace(ns)) {
    if (controlledBy(rs, uid)) owned.push_back(rs);
  }
  DeploymentPlan plan =
      planDeployment(*d, owned, pods_->cache().listInNamespace(ns), SystemClock::instance().wallNow());
  const k8s::ObjectReference ref = k8s::ObjectReference::of(*d);
  bool failed = false;
  if (plan.create) {
    auto r = client_.create(replicaSetsResource(), ns, *plan.create);
    if (r.ok()) {
      (void)events_->record(ref, k8s::EventType::kNormal, "ScalingReplicaSet", "Scale",
                            strCat("Scaled up replica set ", k8s::objectName(*plan.create), " to ",
                                   (*plan.create)["spec"]["replicas"].get<int>()));
    } else if (!absl::IsAlreadyExists(r.status())) {
      failed = true;
      log_.warn("cannot create the ReplicaSet", {{"deployment", key}, {"error", std::string(r.status().message())}});
    }
  }
  for (const auto& [rs, replicas] : plan.scale) {
    auto r = client_.mergePatch(replicaSetsResource(), ns, rs,
                                {{"spec", {{"replicas", replicas}}},
                                 {"metadata",
                                  {{"annotations",
                                    {{"deployment.kubernetes.io/desired-replicas",
                                      std::to_string(d->value("/spec/replicas"_json_pointer, int64_t{1}))}}}}}});
    if (!r.ok()) {
      failed = true;
      continue;
    }
    (void)events_->record(ref, k8s::EventType::kNormal, "ScalingReplicaSet", "Scale",
                          strCat("Scaled replica set ", rs, " to ", replicas));
  }
  for (const std::string& rs : plan.remove) (void)client_.remove(replicaSetsResource(), ns, rs);
  const json current = d->value("status", json::object());
  if (current != plan.status) {
    auto r = client_.mergePatchStatus(k8s::deploymentsResource(), ns, name, {{"status", plan.status}});
    if (!r.ok() && !absl::IsNotFound(r.status())) failed = true;
  }
  if (failed) {
    queue_.addRateLimited(strCat("deploy/", key));
    return;
  }
  queue_.forget(strCat("deploy/", key));
  // The progress deadline is a matter of time: look again while a rollout runs.
  if (plan.status["updatedReplicas"] != d->value("/spec/replicas"_json_pointer, json(1)) ||
      plan.status["replicas"] != plan.status["updatedReplicas"]) {
    queue_.addAfter(strCat("deploy/", key), std::chrono::seconds(5));
  }
}

// Keeps the Service's EndpointSlice equal to what its pods say; removes it
// when the Service has no selector (its slices are then the user's).
void ControllerManager::syncService(const std::string& key) {
  const auto [ns, name] = k8s::splitObjectKey(key);
  std::optional<json> svc = services_->cache().getByKey(key);
  std::optional<json> want;
  if (svc && !svc->contains("/metadata/deletionTimestamp"_json_pointer)) {
    want = planEndpointSlice(*svc, pods_->cache().listInNamespace(ns));
  }
  bool failed = false;
  for (const json& have : slices_->cache().listByLabel("kubernetes.io/service-name", name)) {
    if (k8s::objectNamespace(have) != ns) continue;
    if (want && k8s::objectName(have) == (*want)["metadata"]["name"]) {
      if (have.value("endpoints", json::array()) == (*want)["endpoints"] &&
          have.value("ports", json::array()) == (*want)["ports"]) {
        want.reset();  // already so
        continue;
      }
      json updated = *want;
      updated["metadata"]["resourceVersion"] = k8s::objectResourceVersion(have);
      auto r = client_.update(k8s::endpointSlicesResource(), ns, updated);
      failed = failed || (!r.ok() && !absl::IsNotFound(r.status()));
      want.reset();
      continue;
    }
    auto r = client_.remove(k8s::endpointSlicesResource(), ns, k8s::objectName(have));
    failed = failed || (!r.ok() && !absl::IsNotFound(r.status()));
  }
  if (want) {
    auto r = client_.create(k8s::endpointSlicesResource(), ns, *want);
    failed = failed || (!r.ok() && !absl::IsAlreadyExists(r.status()));
  }
  if (failed) {
    queue_.addRateLimited(strCat("svc/", key));
  } else {
    queue_.forget(strCat("svc/", key));
  }
}

}  // namespace tandem::kubelet
