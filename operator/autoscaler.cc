#include "operator/autoscaler.h"

#include <algorithm>
#include <cmath>

#include "operator/planner/prometheus_signals.h"
#include "operator/reconciler.h"
#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/http/client.h"
#include "src/k8s/resource.h"

namespace tandem::op {
namespace {

using nlohmann::json;

constexpr const char* kFieldManager = "tandem-planner";
// Rates over twice the interval, and never less than 10 s (keep the interval
// at least twice Prometheus' scrape interval).
constexpr double kMinWindowS = 10;

double epochSeconds(WallTime t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }

std::optional<double> timeAt(const json& obj, const json::json_pointer& p) {
  if (!obj.contains(p) || !obj[p].is_string()) return std::nullopt;
  WallTime t;
  if (!k8s::parseTime(obj[p].get<std::string>(), &t)) return std::nullopt;
  return epochSeconds(t);
}

planner::PodInfo podInfo(const json& pod, planner::PlanRole role) {
  planner::PodInfo p;
  p.name = pod.value("/metadata/name"_json_pointer, "");
  p.role = role;
  p.deleting = pod.contains("/metadata/deletionTimestamp"_json_pointer);
  p.created_s = timeAt(pod, "/metadata/creationTimestamp"_json_pointer).value_or(0);
  for (const json& cs : pod.value("/status/containerStatuses"_json_pointer, json::array())) {
    if (cs.is_object() && cs.contains("restartCount") && cs["restartCount"].is_number_integer()) {
      p.restarts += cs["restartCount"].get<int64_t>();
    }
  }
  for (const json& c : pod.value("/status/conditions"_json_pointer, json::array())) {
    const std::string type = c.value("type", "");
    if (type == "Ready" && c.value("status", "") == "True") {
      p.ready = true;
      p.ready_since_s = timeAt(c, "/lastTransitionTime"_json_pointer).value_or(p.created_s);
    }
    if (type == "PodScheduled" && c.value("status", "") == "False" && c.value("reason", "") == "Unschedulable") {
      p.unschedulable = true;
    }
  }
  return p;
}

json roleJson(const planner::RoleDecision& d) {
  return {{"from", d.current},
          {"to", d.desired},
          {"reason", planner::reasonName(d.reason)},
          {"message", d.message},
          {"needed", std::round(d.needed * 100) / 100},
          {"capacityPerReplica", std::round(d.capacity * 100) / 100},
          {"pressure", std::round(d.pressure * 1000) / 1000}};
}

json inputsJson(const planner::Signals& s) {
  json in = {{"uncachedPromptTokensPerSecond", std::round(s.uncached_prompt_tokens_per_s)},
             {"prefillQueueTokens", std::round(s.prefill_queue_tokens)},
             {"decodeKvUsedRatio", std::round(s.decode_kv_used_ratio * 1000) / 1000},
             {"decodeRunning", s.decode_running},
             {"requestsPerSecond", std::round(s.requests_per_s * 100) / 100},
             {"preemptionsPerSecond", std::round(s.preemptions_per_s * 100) / 100},
             {"fallbackShare", std::round(s.fallback_share * 1000) / 1000}};
  // null when there was none (a merge patch would keep an older value otherwise).
  in["ttftP95Seconds"] = s.ttft_p95_s ? json(std::round(*s.ttft_p95_s * 1000) / 1000) : json();
  in["tpotP95Seconds"] = s.tpot_p95_s ? json(std::round(*s.tpot_p95_s * 10000) / 10000) : json();
  return in;
}

// A notable hold gets an event; a plain Hold or Cooldown does not (every interval would).
bool notable(planner::Reason r) {
  using planner::Reason;
  return r == Reason::kMissingData || r == Reason::kUnschedulable || r == Reason::kManualOverride ||
         r == Reason::kSloMissed || r == Reason::kBudget;
}

}  // namespace

planner::PlannerConfig plannerConfigFor(const PoolSpec& pool, std::optional<double> measured_startup_s) {
  const AutoscalingSpec& a = pool.autoscaling;
  planner::PlannerConfig c;
  c.ttft_target_s = a.ttft_target_s;
  c.tpot_target_s = a.tpot_target_s;
  c.min_free_kv_ratio = a.min_free_kv_ratio;
  c.prefill = {a.prefill_min, a.prefill_max};
  c.decode = {a.decode_min, a.decode_max};
  c.gpus_per_prefill = pool.prefill.gpus_per_pod;
  c.gpus_per_decode = pool.decode.gpus_per_pod;
  c.gpu_budget = a.gpu_budget;
  c.scale_up_cooldown_s = a.scale_up_cooldown_s;
  c.scale_down_cooldown_s = a.scale_down_cooldown_s;
  c.warmup_s = a.warmup_s;
  c.interval_s = a.interval_s;
  c.scale_up_check_s = a.scaleUpCheckSeconds();
  if (auto it = pool.router_policy.find("directMaxSuffix"); it != pool.router_policy.end() && it->is_number()) {
    c.base_knobs.direct_max_suffix_tokens = static_cast<int64_t>(it->get<double>());
  }
  if (auto it = pool.router_policy.find("loadFloorWeight"); it != pool.router_policy.end() && it->is_number()) {
    c.base_knobs.load_floor_weight = it->get<double>();
  }
  if (auto it = pool.router_policy.find("prefillOverloadTokens"); it != pool.router_policy.end() && it->is_number()) {
    c.base_knobs.prefill_overload_tokens = static_cast<int64_t>(it->get<double>());
    c.prefill_overload_from_pool = true;
  }
  // The slower of the default and what this pool's pods took: a model that
  // loads in minutes is planned for as such.
  if (measured_startup_s) c.startup_s = std::max(c.startup_s, *measured_startup_s);
  c.max_signal_age_s = std::max(c.max_signal_age_s, 4 * a.interval_s);
  return c;
}

json routingConfigMap(const PoolSpec& pool, const json& pool_object, const planner::RoutingKnobs& knobs) {
  const json data = {{"directMaxSuffixTokens", knobs.direct_max_suffix_tokens},
                     {"loadFloorWeight", knobs.load_floor_weight},
                     {"prefillOverloadTokens", knobs.prefill_overload_tokens}};
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata",
           {{"name", strCat(pool.name, "-routing")},
            {"namespace", pool.ns},
            {"labels",
             {{"app.kubernetes.io/name", "tandem"},
              {"app.kubernetes.io/instance", pool.name},
              {"app.kubernetes.io/managed-by", "tandem-operator"}}},
            {"ownerReferences",
             json::array({{{"apiVersion", pool_object.value("apiVersion", "serving.tandem.dev/v1alpha1")},
                           {"kind", "InferencePool"},
                           {"name", pool.name},
                           {"uid", pool.uid},
                           {"controller", true},
                           {"blockOwnerDeletion", true}}})}}},
          {"data", {{"knobs.json", data.dump()}}}};
}

Autoscaler::Autoscaler(k8s::Client& client, k8s::Informer& pools, k8s::Informer& pods, k8s::EventRecorder& events,
                       metrics::Registry& registry, AutoscalerOptions options)
    : client_(client),
      pools_(pools),
      pods_(pods),
      events_(events),
      options_(std::move(options)),
      desired_(metrics::buildGauge()
                   .name("tandem_planner_desired_replicas")
                   .help("Replicas the planner last decided, by namespace, pool and role.")
                   .registerOn(registry)),
      inputs_(metrics::buildGauge()
                  .name("tandem_planner_input")
                  .help("The signals the planner last decided on, by namespace, pool and signal (units in the signal's name).")
                  .registerOn(registry)),
      decisions_(metrics::buildCounter()
                     .name("tandem_planner_decisions_total")
                     .help("Planner decisions by namespace, pool, role and reason (ScaleUp, ScaleDown, Hold, Cooldown, "
                           "MissingData, Unschedulable, SloMissed, Budget, ManualOverride, Bounds).")
                     .registerOn(registry)),
      slo_targets_(metrics::buildGauge()
                       .name("tandem_pool_slo_target_seconds")
                       .help("Each autoscaled pool's SLO targets, by namespace, pool and slo (ttft_p95, tpot_p95).")
                       .registerOn(registry)) {}

Autoscaler::~Autoscaler() { stop(); }

void Autoscaler::start() {
  std::lock_guard l(mu_);
  if (!stopped_) return;
  stopped_ = false;
  stopping_.store(false);
  thread_ = std::thread([this] { loop(); });
}

void Autoscaler::stop() {
  {
    std::lock_guard l(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stopping_.store(true);
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // A replica that no longer plans (lost the lease, stopping) exports no
  // planner series: the leader's are the only ones Prometheus sees.
  for (auto* family : {&desired_, &inputs_, &slo_targets_}) family->removeMatching({});
  decisions_.removeMatching({});
}

void Autoscaler::loop() {
  std::unique_lock l(mu_);
  while (!cv_.wait_for(l, options_.tick, [&] { return stopped_; })) {
    l.unlock();
    const double now = epochSeconds(SystemClock::instance().wallNow());
    std::map<std::string, PoolState> live;
    for (const json& pool : pools_.cache().list()) {
      if (stopping_.load()) break;  // lost the lease or stopping: write nothing more
      const std::string key = k8s::objectKey(pool);
      PoolState& st = pools_state_[key];
      const std::string uid = pool.value("/metadata/uid"_json_pointer, "");
      if (st.uid != uid) st = PoolState{.uid = uid};  // a new pool under an old name starts afresh
      const bool interval = now >= st.next_s;
      const bool check = !interval && st.next_check_s > 0 && now >= st.next_check_s;
      if (interval || check) {
        // What the API server or Prometheus hands over is input: one pool's
        // surprise must not stop the others' planning (or the operator).
        try {
          planPool(pool, st, now, check);
        } catch (const std::exception& e) {
          log_.error("planning a pool failed; trying again in a minute", {{"pool", key}, {"error", e.what()}});
          if (check) {
            st.next_check_s = now + 60;
          } else {  // no checks until an interval has decided again
            st.next_s = now + 60;
            st.next_check_s = 0;
          }
        }
      }
      live[key] = std::move(st);
    }
    for (const auto& [key, st] : pools_state_) {  // deleted pools are forgotten, their series too
      if (live.count(key)) continue;
      const auto [ns, name] = k8s::splitObjectKey(key);
      const metrics::Labels pool = {{"namespace", std::string(ns)}, {"pool", std::string(name)}};
      for (auto* family : {&desired_, &inputs_, &slo_targets_}) family->removeMatching(pool);
      decisions_.removeMatching(pool);
    }
    pools_state_ = std::move(live);
    l.lock();
  }
}

std::map<std::string, std::vector<planner::PromSample>> fetchAnswers(const std::string& url,
                                                                     const std::vector<planner::SignalQuery>& queries,
                                                                     Duration timeout,
                                                                     std::map<std::string, std::string>* errors) {
  std::map<std::string, std::vector<planner::PromSample>> answers;
  for (const planner::SignalQuery& q : queries) {
    auto one = [&]() -> absl::StatusOr<std::vector<planner::PromSample>> {
      TANDEM_ASSIGN_OR_RETURN(http::ClientResponse r,
                              http::httpGet(strCat(url, "/api/v1/query?query=", k8s::percentEncode(q.promql)), timeout));
      // Prometheus answers its own errors (a bad query: 400, 422) in the JSON shape.
      if (r.status != 200 && r.status != 400 && r.status != 422) {
        return absl::UnavailableError(strCat("HTTP ", r.status, " from ", url));
      }
      TANDEM_ASSIGN_OR_RETURN(json body, r.json());
      return planner::parseQueryResponse(body);
    };
    absl::StatusOr<std::vector<planner::PromSample>> samples = one();
    if (!samples.ok()) {
      if (errors) (*errors)[q.name] = std::string(samples.status().message());
      continue;
    }
    answers[q.name] = std::move(*samples);
  }
  return answers;
}

std::map<std::string, std::vector<planner::PromSample>> Autoscaler::query(
    const std::string& url, const std::string& pool_key, const std::vector<planner::SignalQuery>& queries) {
  std::map<std::string, std::string> errors;
  auto answers = fetchAnswers(url, queries, options_.query_timeout, &errors);
  for (const planner::SignalQuery& q : queries) {
    const std::string error_key = strCat(pool_key, " ", q.name);
    auto e = errors.find(q.name);
    if (e == errors.end()) {
      query_errors_.erase(error_key);
      continue;
    }
    if (query_errors_[error_key] != e->second) {  // logged once until it changes
      log_.warn("a Prometheus query failed", {{"pool", pool_key}, {"query", q.promql}, {"error", e->second}});
      query_errors_[error_key] = e->second;
    }
  }
  return answers;
}

absl::Status Autoscaler::writeCondition(const PoolSpec& pool, PoolState& state, bool ok, const std::string& reason,
                                        const std::string& message, const json& previous_status) {
  json previous = previous_status.value("conditions", json::array());
  json conditions = json::array();
  std::string since = k8s::formatTime(SystemClock::instance().wallNow());
  const std::string status = ok ? "True" : "False";
  bool same = false;
  for (const json& c : previous) {
    if (c.value("type", "") != "Autoscaling") {
      conditions.push_back(c);
      continue;
    }
    if (c.value("status", "") == status) since = c.value("lastTransitionTime", since);
    same = c.value("status", "") == status && c.value("reason", "") == reason && c.value("message", "") == message;
  }
  if (same) {
    state.condition = reason;
    return absl::OkStatus();
  }
  conditions.push_back({{"type", "Autoscaling"},
                        {"status", status},
                        {"reason", reason},
                        {"message", message},
                        {"lastTransitionTime", since},
                        {"observedGeneration", pool.generation}});
  TANDEM_RETURN_IF_ERROR(
      client_.mergePatchStatus(inferencePoolsResource(), pool.ns, pool.name, {{"status", {{"conditions", conditions}}}})
          .status());
  state.condition = reason;
  return absl::OkStatus();
}

void Autoscaler::planPool(const json& object, PoolState& st, double now, bool check) {
  absl::StatusOr<PoolSpec> parsed = parsePool(object);
  if (!parsed.ok()) {  // the reconciler reports it (Degraded)
    st.next_s = now + 30;
    st.next_check_s = 0;
    return;
  }
  const PoolSpec& pool = *parsed;
  const AutoscalingSpec& a = pool.autoscaling;
  const double check_every = a.scaleUpCheckSeconds();
  // An interval shortened since the next one was scheduled applies now.
  st.next_s = std::min(st.next_s, now + a.interval_s);
  st.next_check_s = check_every > 0 ? now + check_every : 0;
  if (check && check_every <= 0) return;  // turned off since this check was scheduled
  const std::string key = k8s::objectKey(object);
  const json previous_status = object.value("status", json::object());
  if (!a.enabled) {  // seen by a check as by an interval: paused at once
    st.next_s = now + 5;
    st.next_check_s = 0;
    st.planner = {};
    st.restored = false;
    bool had = false;
    for (const json& c : previous_status.value("conditions", json::array())) had |= c.value("type", "") == "Autoscaling";
    if (had && st.condition != "Paused") {
      absl::Status s = writeCondition(pool, st, false, "Paused", "spec.autoscaling.enabled is false: replicas are the user's",
                                      previous_status);
      if (!s.ok()) log_.warn("writing the Autoscaling condition failed", {{"pool", key}, {"error", std::string(s.message())}});
    }
    return;
  }
  if (!check) st.next_s = now + a.interval_s;
  if (!st.exported) {  // every reason from the start: increase() sees each one's first decision
    st.exported = true;
    for (planner::PlanRole r : planner::kPlanRoles) {
      for (planner::Reason reason : planner::kReasons) {
        decisions_.add({{"namespace", pool.ns}, {"pool", pool.name}, {"role", planner::planRoleName(r)},
                        {"reason", planner::reasonName(reason)}});
      }
    }
  }
  slo_targets_.add({{"namespace", pool.ns}, {"pool", pool.name}, {"slo", "ttft_p95"}}).set(a.ttft_target_s);
  slo_targets_.add({{"namespace", pool.ns}, {"pool", pool.name}, {"slo", "tpot_p95"}}).set(a.tpot_target_s);
  // After a restart: what the planner wrote last, so a user's edit since is seen as one.
  if (!st.restored) {
    st.restored = true;
    if (previous_status.contains("lastScaling")) {
      const json& ls = previous_status["lastScaling"];
      auto to = [&](const json::json_pointer& p) {
        return ls.is_object() && ls.contains(p) && ls[p].is_number_integer() ? static_cast<int32_t>(ls[p].get<int64_t>())
                                                                             : int32_t{-1};
      };
      st.planner.prefill.written = to("/prefill/to"_json_pointer);
      st.planner.decode.written = to("/decode/to"_json_pointer);
    }
  }
  std::vector<planner::PodInfo> pods;
  for (const json& p : pods_.cache().listByLabel("app.kubernetes.io/instance", pool.name)) {
    if (k8s::objectNamespace(p) != pool.ns) continue;
    const std::string role = p.value("/metadata/labels/serving.tandem.dev~1role"_json_pointer, "");
    if (role == "prefill") pods.push_back(podInfo(p, planner::PlanRole::kPrefill));
    if (role == "decode") pods.push_back(podInfo(p, planner::PlanRole::kDecode));
  }
  const std::string url = a.prometheus_url.empty() ? options_.prometheus_url : a.prometheus_url;
  const std::vector<planner::SignalQuery> queries =
      planner::signalQueries(pool.ns, pool.name, std::max(kMinWindowS, 2 * a.interval_s));
  std::map<std::string, std::vector<planner::PromSample>> answers;
  if (!url.empty()) answers = query(url, key, queries);
  planner::Signals signals =
      planner::assembleSignals(queries, answers, pods, pool.prefill.replicas, pool.decode.replicas, now);
  signals.kv_block_tokens = pool.block_size;
  if (url.empty()) {
    signals.missing = {"every series: no Prometheus URL (spec.autoscaling.prometheusUrl, or the operator's --prometheus-url)"};
  }
  std::optional<double> startup = planner::measuredStartup(pods, planner::PlanRole::kPrefill);
  if (auto d = planner::measuredStartup(pods, planner::PlanRole::kDecode)) startup = std::max(startup.value_or(0), *d);
  const planner::PlannerConfig config = plannerConfigFor(pool, startup);
  const planner::PlannerState before = st.planner;
  const planner::Decision d =
      check ? planner::checkScaleUp(config, signals, st.planner) : planner::decide(config, signals, st.planner);
  if (check && !d.acted()) return;  // holds are the intervals' to report

  for (planner::PlanRole r : planner::kPlanRoles) {
    const planner::RoleDecision& rd = d.role(r);
    desired_.add({{"namespace", pool.ns}, {"pool", pool.name}, {"role", planner::planRoleName(r)}}).set(rd.desired);
    if (check && rd.desired == rd.current) continue;
    decisions_
        .add({{"namespace", pool.ns}, {"pool", pool.name}, {"role", planner::planRoleName(r)},
              {"reason", planner::reasonName(rd.reason)}})
        .increment();
  }
  if (signals.missing.empty()) {
    const std::pair<const char*, double> in[] = {
        {"uncached_prompt_tokens_per_second", signals.uncached_prompt_tokens_per_s},
        {"prefill_queue_tokens", signals.prefill_queue_tokens},
        {"decode_kv_used_ratio", signals.decode_kv_used_ratio},
        {"decode_running", signals.decode_running},
        {"ttft_p95_seconds", signals.ttft_p95_s.value_or(0)},
        {"tpot_p95_seconds", signals.tpot_p95_s.value_or(0)},
        {"preemptions_per_second", signals.preemptions_per_s},
        {"fallback_share", signals.fallback_share},
        {"prefill_capacity_tokens_per_second", d.prefill.capacity},
        {"prefill_correction", d.prefill.correction},
        {"startup_seconds", config.startup_s}};
    for (const auto& [name, v] : in) inputs_.add({{"namespace", pool.ns}, {"pool", pool.name}, {"signal", name}}).set(v);
  }

  if (stopping_.load()) return;  // no write from a planner being stopped (it may have lost the lease)
  const k8s::ObjectReference ref = k8s::ObjectReference::of(object);
  auto event = [&](k8s::EventType type, const char* reason, const std::string& note) {
    absl::Status s = events_.record(ref, type, reason, "Autoscale", note);
    if (!s.ok()) log_.warn("recording an event failed", {{"pool", key}, {"error", std::string(s.message())}});
  };
  if (d.acted()) {
    json spec = json::object();
    for (planner::PlanRole r : planner::kPlanRoles) {
      if (d.role(r).desired != d.role(r).current) spec[planner::planRoleName(r)] = {{"replicas", d.role(r).desired}};
    }
    absl::Status s = client_
                         .mergePatch(inferencePoolsResource(), pool.ns, pool.name, {{"spec", spec}},
                                     k8s::PatchOptions{.fieldManager = kFieldManager})
                         .status();
    if (!s.ok()) {
      log_.warn("writing the pool's replicas failed", {{"pool", key}, {"error", std::string(s.message())}});
      event(k8s::EventType::kWarning, "ScalingFailed", strCat("writing spec replicas failed: ", s.message()));
      // Not written: as if not decided (no cooldown started); the next
      // interval decides again from what is there.
      st.planner = before;
      return;
    }
    for (planner::PlanRole r : planner::kPlanRoles) {
      const planner::RoleDecision& rd = d.role(r);
      if (rd.desired == rd.current) continue;
      event(k8s::EventType::kNormal, rd.desired > rd.current ? "ScaledUp" : "ScaledDown",
            strCat(planner::planRoleName(r), " ", rd.current, " -> ", rd.desired, " (", planner::reasonName(rd.reason),
                   "): ", check ? "checked between intervals: " : "", rd.message));
    }
    log_.info("scaled", {{"pool", key},
                         {"prefill", strCat(d.prefill.current, "->", d.prefill.desired)},
                         {"decode", strCat(d.decode.current, "->", d.decode.desired)},
                         {"prefill_reason", planner::reasonName(d.prefill.reason)},
                         {"decode_reason", planner::reasonName(d.decode.reason)},
                         {"between_intervals", check ? "true" : "false"}});
  }
  for (planner::PlanRole r : planner::kPlanRoles) {
    const planner::RoleDecision& rd = d.role(r);
    if (!check && rd.desired == rd.current && notable(rd.reason)) {
      event(rd.reason == planner::Reason::kManualOverride ? k8s::EventType::kNormal : k8s::EventType::kWarning,
            planner::reasonName(rd.reason), strCat(planner::planRoleName(r), ": ", rd.message));
    }
  }
  const bool manual = d.prefill.reason == planner::Reason::kManualOverride ||
                      d.decode.reason == planner::Reason::kManualOverride;
  if (d.acted() || manual) {
    json last = {{"time", k8s::formatTime(SystemClock::instance().wallNow())},
                 {"prefill", roleJson(d.prefill)},
                 {"decode", roleJson(d.decode)},
                 {"inputs", inputsJson(signals)}};
    absl::Status s = client_
                         .mergePatchStatus(inferencePoolsResource(), pool.ns, pool.name, {{"status", {{"lastScaling", last}}}},
                                           k8s::PatchOptions{.fieldManager = kFieldManager})
                         .status();
    if (!s.ok()) log_.warn("writing status.lastScaling failed", {{"pool", key}, {"error", std::string(s.message())}});
  }
  if (check) return;  // the condition and the routing knobs are the intervals'
  absl::Status cs = signals.missing.empty()
                        ? writeCondition(pool, st, true, "Active", "the planner sizes prefill and decode", previous_status)
                        : writeCondition(pool, st, false, "MissingData", d.prefill.message, previous_status);
  if (!cs.ok()) log_.warn("writing the Autoscaling condition failed", {{"pool", key}, {"error", std::string(cs.message())}});

  // The routing knobs, when they change.
  if (signals.missing.empty() && (!st.knobs || *st.knobs != d.knobs)) {
    absl::Status s = client_
                         .apply(k8s::configMapsResource(), pool.ns, routingConfigMap(pool, object, d.knobs),
                                k8s::ApplyOptions{.fieldManager = kFieldManager, .force = true})
                         .status();
    if (s.ok()) {
      st.knobs = d.knobs;
    } else {
      log_.warn("writing the routing knobs failed", {{"pool", key}, {"error", std::string(s.message())}});
    }
  }
}

}  // namespace tandem::op
