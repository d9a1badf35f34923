#include "operator/reconciler.h"

#include <chrono>

#include "operator/children.h"
#include "operator/deletion_cost.h"
#include "operator/pool.h"
#include "operator/pool_status.h"
#include "src/auth/pool_key.h"
#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/http/client.h"
#include "src/k8s/resource.h"

namespace tandem::op {

using nlohmann::json;

namespace {

constexpr const char* kManagedBy = "app.kubernetes.io/managed-by=tandem-operator";
constexpr const char* kFieldManager = "tandem-operator";

k8s::ResourceRef refForKind(const std::string& kind) {
  if (kind == "Deployment") return k8s::deploymentsResource();
  if (kind == "Service") return k8s::servicesResource();
  if (kind == "ConfigMap") return k8s::configMapsResource();
  if (kind == "ServiceAccount") return {"", "v1", "serviceaccounts", true};
  if (kind == "Role") return {"rbac.authorization.k8s.io", "v1", "roles", true};
  return {"rbac.authorization.k8s.io", "v1", "rolebindings", true};
}

int64_t intAt(const json& j, const json::json_pointer& p, int64_t fallback = 0) {
  return j.contains(p) && j.at(p).is_number_integer() ? j.at(p).get<int64_t>() : fallback;
}

const json* conditionOf(const json& pool, std::string_view type) {
  const json::json_pointer p("/status/conditions");
  if (!pool.contains(p) || !pool.at(p).is_array()) return nullptr;
  for (const json& c : pool.at(p)) {
    if (c.value("type", "") == type) return &c;
  }
  return nullptr;
}

}  // namespace

k8s::ResourceRef inferencePoolsResource() { return {"serving.tandem.dev", "v1alpha1", "inferencepools", true}; }

bool holds(const json& observed, const json& desired) {
  if (desired.is_object()) {
    if (!observed.is_object()) return false;
    for (const auto& [k, v] : desired.items()) {
      auto it = observed.find(k);
      if (it == observed.end() || !holds(*it, v)) return false;
    }
    return true;
  }
  if (desired.is_array()) {
    if (!observed.is_array() || observed.size() != desired.size()) return false;
    for (size_t i = 0; i < desired.size(); ++i) {
      if (!holds(observed[i], desired[i])) return false;
    }
    return true;
  }
  if (desired.is_number() && observed.is_number()) return desired.get<double>() == observed.get<double>();
  return observed == desired;
}

Reconciler::Reconciler(k8s::Client& client, metrics::Registry& registry, ReconcilerOptions options)
    : client_(client),
      registry_(registry),
      options_(std::move(options)),
      reconciles_(metrics::buildCounter()
                      .name("tandem_operator_reconcile_total")
                      .help("InferencePool reconciles by result: success, error (retried with back-off), invalid "
                            "(the spec cannot be made into pods; Degraded says why).")
                      .registerOn(registry)),
      reconcile_seconds_(metrics::buildHistogram()
                             .name("tandem_operator_reconcile_seconds")
                             .help("Time one reconcile of one InferencePool took.")
                             .buckets(metrics::exponentialBuckets(0.001, 2, 14))
                             .registerOn(registry)
                             .add({})),
      pool_replicas_(metrics::buildGauge()
                         .name("tandem_pool_replicas")
                         .help("Each pool's desired replicas by namespace, pool and role (status.<role>.replicas).")
                         .registerOn(registry)),
      pool_ready_replicas_(metrics::buildGauge()
                               .name("tandem_pool_ready_replicas")
                               .help("Each pool's ready replicas by namespace, pool and role (status.<role>.readyReplicas).")
                               .registerOn(registry)) {}

absl::StatusOr<std::unique_ptr<Reconciler>> Reconciler::start(k8s::Client& client, metrics::Registry& registry,
                                                              ReconcilerOptions options) {
  std::unique_ptr<Reconciler> r(new Reconciler(client, registry, std::move(options)));
  TANDEM_RETURN_IF_ERROR(r->begin());
  return r;
}

Reconciler::~Reconciler() { stop(); }

void Reconciler::enqueueOwner(const json& child) {
  for (const json& ref : child.value("/metadata/ownerReferences"_json_pointer, json::array())) {
    if (ref.value("kind", "") == "InferencePool" && ref.value("controller", false)) {
      queue_.add(k8s::objectKey(k8s::objectNamespace(child), ref.value("name", "")));
      return;
    }
  }
  // Pods are owned by ReplicaSets: their pool is their instance label.
  const std::string pool = child.value("/metadata/labels/app.kubernetes.io~1instance"_json_pointer, "");
  if (!pool.empty()) queue_.add(k8s::objectKey(k8s::objectNamespace(child), pool));
}

absl::Status Reconciler::begin() {
  events_ = std::make_unique<k8s::EventRecorder>(
      client_, k8s::EventRecorderOptions{.reportingController = "serving.tandem.dev/operator",
                                         .reportingInstance = options_.identity});
  const auto onChild = k8s::InformerHandlers::onAnyChange([this](const json& o) { enqueueOwner(o); });
  auto childInformer = [&](k8s::ResourceRef ref) {
    return std::make_unique<k8s::Informer>(
        client_, SystemClock::instance(),
        k8s::InformerOptions{.resource = std::move(ref), .ns = options_.ns, .labelSelector = kManagedBy}, onChild);
  };
  pools_ = std::make_unique<k8s::Informer>(
      client_, SystemClock::instance(),
      k8s::InformerOptions{.resource = inferencePoolsResource(), .ns = options_.ns, .resyncPeriod = options_.resync},
      k8s::InformerHandlers::onAnyChange([this](const json& p) { queue_.add(k8s::objectKey(p)); }));
  deployments_ = childInformer(refForKind("Deployment"));
  services_ = childInformer(refForKind("Service"));
  config_maps_ = childInformer(refForKind("ConfigMap"));
  service_accounts_ = childInformer(refForKind("ServiceAccount"));
  roles_ = childInformer(refForKind("Role"));
  role_bindings_ = childInformer(refForKind("RoleBinding"));
  pods_ = childInformer(k8s::podsResource());
  const std::vector<k8s::Informer*> all = {pools_.get(), deployments_.get(), services_.get(), config_maps_.get(),
                                           service_accounts_.get(), roles_.get(), role_bindings_.get(), pods_.get()};
  for (k8s::Informer* i : all) i->start();
  for (k8s::Informer* i : all) {
    if (!i->waitForSync(std::chrono::seconds(30))) {
      return absl::UnavailableError(
          "operator: inferencepools and the objects it manages could not be listed within 30 s (is the "
          "InferencePool CRD installed? crds/inferencepool.yaml)");
    }
  }
  for (int i = 0; i < std::max(1, options_.workers); ++i) workers_.emplace_back([this] { work(); });
  if (options_.deletion_cost_period > Duration::zero()) {
    costs_ = std::thread([this] {
      std::unique_lock l(stop_mu_);
      while (!stop_cv_.wait_for(l, options_.deletion_cost_period, [&] { return stopped_; })) {
        l.unlock();
        refreshDeletionCosts();
        l.lock();
      }
    });
  }
  autoscaler_ = std::make_unique<Autoscaler>(client_, *pools_, *pods_, *events_, registry_, options_.autoscaler);
  autoscaler_->start();
  log_.info("reconciling InferencePools", {{"namespace", options_.ns.empty() ? "(all)" : options_.ns}});
  return absl::OkStatus();
}

void Reconciler::stop() {
  {
    std::lock_guard l(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stop_cv_.notify_all();
  if (autoscaler_) autoscaler_->stop();
  if (costs_.joinable()) costs_.join();
  queue_.shutDown();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  // Not leading (or stopping): the leader's pool series are the only ones
  // exported. After the workers, so none sets one again.
  pool_replicas_.removeMatching({});
  pool_ready_replicas_.removeMatching({});
  for (auto* i : {&pools_, &deployments_, &services_, &config_maps_, &service_accounts_, &roles_, &role_bindings_,
                  &pods_}) {
    if (*i) (*i)->stop();
  }
}

void Reconciler::refreshDeletionCosts() {
  for (const json& pod : pods_->cache().listByLabel("serving.tandem.dev/role", "decode")) {
    const std::string ip = pod.value("/status/podIP"_json_pointer, std::string());
    if (ip.empty() || pod.value("/status/phase"_json_pointer, std::string()) != "Running" ||
        pod.contains("/metadata/deletionTimestamp"_json_pointer)) {
      continue;
    }
    auto r = http::httpGet(strCat("http://", ip, ":", kAgentPort, "/metrics"), std::chrono::seconds(2));
    if (!r.ok() || r->status != 200) continue;  // not serving yet, or going: its cost stays
    absl::StatusOr<DecodeLoad> load = parseDecodeLoad(r->body);
    if (!load.ok()) continue;
    const std::string cost = std::to_string(deletionCost(*load));
    const json::json_pointer at("/metadata/annotations/controller.kubernetes.io~1pod-deletion-cost");
    if (pod.contains(at) && pod.at(at) == cost) continue;
    auto patched = client_.mergePatch(k8s::podsResource(), k8s::objectNamespace(pod), k8s::objectName(pod),
                                      {{"metadata", {{"annotations", {{kDeletionCostAnnotation, cost}}}}}});
    if (!patched.ok() && !absl::IsNotFound(patched.status())) {
      log_.warn("cannot update a decode pod's deletion cost",
                {{"pod", k8s::objectKey(pod)}, {"error", std::string(patched.status().message())}});
    }
  }
}

void Reconciler::work() {
  while (auto key = queue_.get()) {
    const auto began = std::chrono::steady_clock::now();
    std::string result = "success";
    absl::Status s = reconcile(*key, &result);
    reconcile_seconds_.observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
    if (s.ok()) {
      queue_.forget(*key);
    } else {
      result = "error";
      log_.warn("reconcile failed; retried with back-off", {{"pool", *key}, {"error", std::string(s.message())}});
      queue_.addRateLimited(*key);
    }
    reconciles_.add({{"result", result}}).increment();
    queue_.done(*key);
  }
}

absl::Status Reconciler::ensurePoolKey(const PoolSpec& pool, const k8s::ObjectReference& ref) {
  const std::string secret = poolKeySecretName(pool);
  const std::string key = k8s::objectKey(pool.ns, pool.name);
  const MonoTime now = SystemClock::instance().now();
  {
    absl::MutexLock lock(&created_mu_);
    auto it = pool_keys_seen_.find(key);
    if (it != pool_keys_seen_.end() && it->second.uid == pool.uid && now < it->second.next_check) {
      return absl::OkStatus();
    }
  }
  absl::StatusOr<json> got = client_.get(k8s::secretsResource(), pool.ns, secret);
  if (got.ok()) {
    // One left by an earlier pool of the same name, which the garbage
    // collector is removing: wait for it to go, then create this pool's.
    std::string owner;
    for (const json& o : got->value("/metadata/ownerReferences"_json_pointer, json::array())) {
      if (o.value("kind", "") == "InferencePool") owner = o.value("uid", "");
    }
    if (got->contains("/metadata/deletionTimestamp"_json_pointer) || (!owner.empty() && owner != pool.uid)) {
      return absl::UnavailableError(strCat("Secret ", secret, " belongs to an earlier pool of this name and is being "
                                           "deleted; the pool key is created once it is gone"));
    }
  }
  if (!got.ok()) {
    if (!absl::IsNotFound(got.status())) return got.status();
    TANDEM_ASSIGN_OR_RETURN(const std::string fresh, auth::generatePoolKey());
    absl::StatusOr<json> created = client_.create(k8s::secretsResource(), pool.ns, poolKeySecret(pool, fresh));
    if (!created.ok() && !absl::IsAlreadyExists(created.status())) return created.status();
    if (created.ok()) {
      (void)events_->record(ref, k8s::EventType::kNormal, "Created", "Reconcile",
                            strCat("Created Secret/", secret, ": the pool key its agents authenticate each other "
                                   "with (docs/security.md)"));
    }
  }
  absl::MutexLock lock(&created_mu_);
  if (pool_keys_seen_.size() >= 4096) pool_keys_seen_.clear();
  pool_keys_seen_[key] = {pool.uid, now + kPoolKeyRecheck};
  return absl::OkStatus();
}

absl::Status Reconciler::reconcile(const std::string& key, std::string* result) {
  std::optional<json> pool = pools_->cache().getByKey(key);
  if (!pool || pool->contains("/metadata/deletionTimestamp"_json_pointer)) {
    const auto [ns, name] = k8s::splitObjectKey(key);  // its series go with it
    const metrics::Labels labels = {{"namespace", std::string(ns)}, {"pool", std::string(name)}};
    pool_replicas_.removeMatching(labels);
    pool_ready_replicas_.removeMatching(labels);
    return absl::OkStatus();
  }
  const k8s::ObjectReference ref = k8s::ObjectReference::of(*pool);
  const auto [ns, name] = k8s::splitObjectKey(key);
  const std::string now = k8s::formatTime(SystemClock::instance().wallNow());
  const json previous_status = pool->value("status", json::object());

  absl::StatusOr<PoolSpec> spec = parsePool(*pool);
  if (!spec.ok()) {
    *result = "invalid";
    PoolSpec shell;
    shell.name = std::string(name);
    shell.generation = intAt(*pool, "/metadata/generation"_json_pointer);
    const std::string why(spec.status().message());
    const json* degraded = conditionOf(*pool, "Degraded");
    const bool said = degraded != nullptr && degraded->value("message", "") == why &&
                      degraded->value("observedGeneration", int64_t{-1}) == shell.generation;
    if (!said) (void)events_->record(ref, k8s::EventType::kWarning, "InvalidSpec", "Reconcile", why);
    json status = computeStatus(shell, Observed{}, previous_status, now, why);
    json stored = previous_status;
    if (stored.is_object()) stored.erase("lastScaling");  // the planner's
    if (status != stored) {
      TANDEM_RETURN_IF_ERROR(client_.mergePatchStatus(inferencePoolsResource(), ns, name, {{"status", status}}).status());
    }
    return absl::OkStatus();
  }

  // The pool has not changed since its last complete reconcile: a child that
  // differs was changed by someone else.
  const bool pool_unchanged = intAt(previous_status, "/observedGeneration"_json_pointer, -1) == spec->generation;
  TANDEM_RETURN_IF_ERROR(ensurePoolKey(*spec, ref));
  const Children children = desiredChildren(*spec);
  const k8s::ApplyOptions apply{.fieldManager = kFieldManager, .force = true};
  std::vector<std::string> created, updated;  // one event each for all of them
  for (const json* desired : children.all()) {
    const std::string kind = (*desired)["kind"];
    const std::string child = (*desired)["metadata"]["name"];
    k8s::Informer* informer = kind == "Deployment"       ? deployments_.get()
                              : kind == "Service"        ? services_.get()
                              : kind == "ConfigMap"      ? config_maps_.get()
                              : kind == "ServiceAccount" ? service_accounts_.get()
                              : kind == "Role"           ? roles_.get()
                                                         : role_bindings_.get();
    const std::optional<json> observed = informer->cache().getByKey(k8s::objectKey(ns, child));
    const std::string child_key = strCat(kind, "/", k8s::objectKey(ns, child));
    if (observed) {
      absl::MutexLock lock(&created_mu_);
      created_.erase(child_key);  // the cache has it now
    }
    if (observed && holds(*observed, *desired)) continue;
    std::string note;
    k8s::EventType type = k8s::EventType::kNormal;
    std::string reason = observed ? "Updated" : "Created";
    if (observed && kind == "Deployment") {
      const int64_t have = intAt(*observed, "/spec/replicas"_json_pointer, 1);
      const int64_t want = (*desired)["spec"]["replicas"].get<int64_t>();
      const std::string role = (*desired)["metadata"]["labels"].value("serving.tandem.dev/role", "");
      if (have != want && pool_unchanged) {
        type = k8s::EventType::kWarning;
        reason = "ChildEdited";
        note = strCat("Deployment ", child, ": spec.replicas was set to ", have, " outside the pool and is reverted to ",
                      want, "; the pool is the source of truth (edit spec.", role, ".replicas)");
      } else if (have != want) {
        reason = "Scaled";
        note = strCat(role, ": ", have, " -> ", want, " replicas");
      }
    }
    absl::StatusOr<json> applied = client_.apply(refForKind(kind), ns, *desired, apply);
    TANDEM_RETURN_IF_ERROR(applied.status());
    bool repeat = false;
    if (!observed) {
      // The object's uid: an apply of the child created earlier returns
      // it again (its resourceVersion may have moved: a controller writes
      // a Deployment's status), a child deleted and created again has
      // another.
      const std::string uid = applied->value("/metadata/uid"_json_pointer, "");
      absl::MutexLock lock(&created_mu_);
      // Entries leave when the cache shows the child; one whose pool went
      // first stays. Bounded: forgetting them costs at most a repeated event.
      if (created_.size() >= 4096) created_.clear();
      auto [it, inserted] = created_.try_emplace(child_key, uid);
      repeat = !inserted && !uid.empty() && it->second == uid;  // created by an earlier reconcile
      it->second = uid;
    }
    if (note.empty()) {
      if (!repeat) (observed ? updated : created).push_back(strCat(kind, "/", child));
    } else {
      (void)events_->record(ref, type, reason, "Reconcile", note);
    }
  }
  for (const auto& [reason, list] : {std::pair{"Created", &created}, std::pair{"Updated", &updated}}) {
    if (list->empty()) continue;
    std::string names;
    for (const std::string& n : *list) names += strCat(names.empty() ? "" : ", ", n);
    (void)events_->record(ref, k8s::EventType::kNormal, reason, "Reconcile",
                          strCat(reason, " ", list->size(), list->size() == 1 ? " child: " : " children: ", names));
  }

  Observed observed;
  for (Role r : kRoles) {
    const int i = static_cast<int>(r);
    observed.deployments[i] = deployments_->cache().getByKey(k8s::objectKey(ns, childName(*spec, r)));
    for (const json& p : pods_->cache().listByLabel("app.kubernetes.io/instance", spec->name)) {
      if (k8s::objectNamespace(p) == ns &&
          p.value("/metadata/labels/serving.tandem.dev~1role"_json_pointer, "") == roleName(r)) {
        observed.pods[i].push_back(p);
      }
    }
  }
  observed.router_service = services_->cache().getByKey(k8s::objectKey(ns, spec->name));
  json status = computeStatus(*spec, observed, previous_status, now);
  for (Role r : kRoles) {
    const metrics::Labels labels = {{"namespace", ns}, {"pool", name}, {"role", roleName(r)}};
    pool_replicas_.add(labels).set(status[roleName(r)].value("replicas", 0));
    pool_ready_replicas_.add(labels).set(status[roleName(r)].value("readyReplicas", 0));
  }
  if (!status.contains("endpoint")) status["endpoint"] = nullptr;  // a merge patch removes it
  json stored = previous_status;
  if (!stored.contains("endpoint")) stored["endpoint"] = nullptr;
  if (stored.is_object()) stored.erase("lastScaling");  // the planner's, not compared nor written here
  if (status != stored) {
    TANDEM_RETURN_IF_ERROR(client_.mergePatchStatus(inferencePoolsResource(), ns, name, {{"status", status}}).status());
  }
  return absl::OkStatus();
}

}  // namespace tandem::op
