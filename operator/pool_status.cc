#include "operator/pool_status.h"

#include "src/common/strings.h"

namespace tandem::op {
namespace {

using nlohmann::json;

int64_t intAt(const json& j, const json::json_pointer& p) {
  return j.contains(p) && j.at(p).is_number_integer() ? j.at(p).get<int64_t>() : 0;
}

json condition(const char* type, bool status, const std::string& reason, const std::string& message,
               const json& previous, const std::string& now, int64_t generation) {
  const std::string s = status ? "True" : "False";
  std::string since = now;
  for (const json& c : previous.is_array() ? previous : json::array()) {
    if (c.value("type", "") == type && c.value("status", "") == s) since = c.value("lastTransitionTime", now);
  }
  return {{"type", type},     {"status", s},         {"reason", reason},
          {"message", message}, {"lastTransitionTime", since}, {"observedGeneration", generation}};
}

// The scheduler's message of a pod it could not place, if one of `pods` is such.
std::optional<std::string> unschedulable(const std::vector<json>& pods) {
  for (const json& p : pods) {
    if (p.contains("/metadata/deletionTimestamp"_json_pointer)) continue;
    for (const json& c : p.value("/status/conditions"_json_pointer, json::array())) {
      if (c.value("type", "") == "PodScheduled" && c.value("status", "") == "False" &&
          c.value("reason", "") == "Unschedulable") {
        return c.value("message", "no node fits");
      }
    }
  }
  return std::nullopt;
}

}  // namespace

json computeStatus(const PoolSpec& pool, const Observed& observed, const json& previous_status, const std::string& now,
                   const std::string& spec_error) {
  const json previous = previous_status.is_object() ? previous_status.value("conditions", json::array()) : json::array();
  json status = {{"observedGeneration", pool.generation}};
  std::string unschedulable_msg, creating, rolling, not_ready, scaling;
  bool all_ready = spec_error.empty();
  for (Role r : kRoles) {
    const int i = static_cast<int>(r);
    const int64_t desired = pool.role(r).replicas;
    const std::optional<json>& d = observed.deployments[i];
    const int64_t ready = d ? intAt(*d, "/status/readyReplicas"_json_pointer) : 0;
    const int64_t updated = d ? intAt(*d, "/status/updatedReplicas"_json_pointer) : 0;
    const int64_t current = d ? intAt(*d, "/status/replicas"_json_pointer) : 0;
    status[roleName(r)] = {{"replicas", desired},
                           {"readyReplicas", ready},
                           {"updatedReplicas", updated},
                           {"summary", strCat(ready, "/", desired)}};
    if (!spec_error.empty()) continue;
    const char* sep = "; ";
    if (!d) {
      creating += strCat(creating.empty() ? "" : sep, roleName(r), ": no Deployment yet");
      all_ready = false;
      continue;
    }
    // The Deployment controller has not seen the latest template or replica count yet.
    const bool stale = intAt(*d, "/status/observedGeneration"_json_pointer) < intAt(*d, "/metadata/generation"_json_pointer) ||
                       intAt(*d, "/spec/replicas"_json_pointer) != desired;
    if (auto msg = unschedulable(observed.pods[i]); msg && ready < desired) {
      unschedulable_msg += strCat(unschedulable_msg.empty() ? "" : sep, roleName(r), ": ", *msg);
    }
    if (stale || updated < desired) {
      rolling += strCat(rolling.empty() ? "" : sep, roleName(r), ": ", updated, "/", desired, " updated");
    } else if (current != desired) {
      scaling += strCat(scaling.empty() ? "" : sep, roleName(r), ": ", current, " -> ", desired);
    }
    if (ready < desired) not_ready += strCat(not_ready.empty() ? "" : sep, roleName(r), ": ", ready, "/", desired, " ready");
    if (stale || ready < desired || updated < desired || current != desired) all_ready = false;
  }
  if (observed.router_service) {
    const std::string ip = observed.router_service->value("/spec/clusterIP"_json_pointer, std::string());
    if (!ip.empty() && ip != "None") status["endpoint"] = strCat(ip, ":", 8000);
  }

  const int64_t gen = pool.generation;
  json ready_cond, progressing, degraded;
  if (!spec_error.empty()) {
    ready_cond = condition("Ready", false, "InvalidSpec", spec_error, previous, now, gen);
    progressing = condition("Progressing", false, "InvalidSpec", "the spec cannot be made into pods", previous, now, gen);
  } else if (all_ready) {
    ready_cond = condition("Ready", true, "AllReplicasReady", "every role has its replicas ready", previous, now, gen);
    progressing = condition("Progressing", false, "Stable", "every role has its desired replicas", previous, now, gen);
  } else if (!unschedulable_msg.empty()) {
    ready_cond = condition("Ready", false, "Unschedulable", unschedulable_msg, previous, now, gen);
    progressing = condition("Progressing", false, "Unschedulable", unschedulable_msg, previous, now, gen);
  } else if (!creating.empty()) {
    ready_cond = condition("Ready", false, "Creating", creating, previous, now, gen);
    progressing = condition("Progressing", true, "Creating", creating, previous, now, gen);
  } else if (!rolling.empty()) {
    ready_cond = condition("Ready", false, "RollingOut", rolling, previous, now, gen);
    progressing = condition("Progressing", true, "RollingOut", rolling, previous, now, gen);
  } else {
    ready_cond = condition("Ready", false, "NotReady", not_ready.empty() ? scaling : not_ready, previous, now, gen);
    progressing = condition("Progressing", true, "Scaling", scaling.empty() ? not_ready : scaling, previous, now, gen);
  }
  degraded = spec_error.empty()
                 ? condition("Degraded", false, "AsExpected", "", previous, now, gen)
                 : condition("Degraded", true, "InvalidSpec", spec_error, previous, now, gen);
  status["conditions"] = json::array({ready_cond, progressing, degraded});
  // The planner's condition (operator/autoscaler.h) is kept as it is (its
  // status.lastScaling is not written here at all: a merge patch leaves it).
  for (const json& c : previous) {
    if (c.value("type", "") == "Autoscaling") status["conditions"].push_back(c);
  }
  return status;
}

}  // namespace tandem::op
