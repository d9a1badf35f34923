#include "src/k8s/event_recorder.h"

#include <cstdio>

#include "src/common/status.h"
#include "src/common/strings.h"
#include "src/k8s/errors.h"

namespace tandem::k8s {

namespace {
// Notes are cut to the API server's limit.
constexpr size_t kMaxNote = 1024;
// Above this many remembered series, expired ones are dropped.
constexpr size_t kMaxSeries = 4096;
}  // namespace

ObjectReference ObjectReference::of(const nlohmann::json& object) {
  return {object.value("apiVersion", ""),
          object.value("kind", ""),
          objectNamespace(object),
          objectName(object),
          objectUid(object),
          objectResourceVersion(object)};
}

nlohmann::json ObjectReference::toJson() const {
  nlohmann::json out = {{"apiVersion", apiVersion}, {"kind", kind}, {"name", name}};
  if (!ns.empty()) out["namespace"] = ns;
  if (!uid.empty()) out["uid"] = uid;
  if (!resourceVersion.empty()) out["resourceVersion"] = resourceVersion;
  return out;
}

EventRecorder::EventRecorder(Client& client, EventRecorderOptions options)
    : client_(client),
      options_(std::move(options)),
      clock_(options_.clock ? *options_.clock : SystemClock::instance()) {}

absl::Status EventRecorder::record(const ObjectReference& regarding, EventType type, std::string_view reason,
                                   std::string_view action, std::string_view note) {
  std::string typeName = type == EventType::kWarning ? "Warning" : "Normal";
  std::string noteText(note.substr(0, kMaxNote));
  std::string key = strCat(regarding.kind, "/", regarding.ns, "/", regarding.name, "/", regarding.uid, "|", typeName,
                           "|", reason, "|", action, "|", noteText);
  // Events live in the regarding object's namespace ("default" for cluster-scoped ones).
  std::string ns = regarding.ns.empty() ? "default" : regarding.ns;
  MonoTime now = clock_.now();
  std::string nowText = formatMicroTime(clock_.wallNow());

  std::optional<Series> existing;
  int64_t sequence;
  {
    absl::MutexLock lock(&mu_);
    auto it = series_.find(key);
    if (it != series_.end() && now - it->second.lastSeen < options_.seriesWindow) {
      ++it->second.count;
      it->second.lastSeen = now;
      existing = it->second;
    }
    sequence = ++sequence_;
  }
  if (existing) {
    nlohmann::json patch = {{"series", {{"count", existing->count}, {"lastObservedTime", nowText}}}};
    absl::StatusOr<nlohmann::json> patched =
        client_.mergePatch(eventsResource(), existing->ns, existing->eventName, patch);
    if (!isNotFound(patched.status())) return patched.status();
    // The event expired on the server: start a new one.
  }

  // client-go names events <object>.<unique hex>.
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "%llx",
                static_cast<unsigned long long>(
                    std::chrono::duration_cast<std::chrono::nanoseconds>(clock_.wallNow().time_since_epoch()).count() +
                    sequence));
  std::string eventName = strCat(regarding.name, ".", suffix);
  nlohmann::json event = {{"apiVersion", "events.k8s.io/v1"},
                          {"kind", "Event"},
                          {"metadata", {{"name", eventName}, {"namespace", ns}}},
                          {"eventTime", nowText},
                          {"reportingController", options_.reportingController},
                          {"reportingInstance", options_.reportingInstance},
                          {"action", std::string(action)},
                          {"reason", std::string(reason)},
                          {"regarding", regarding.toJson()},
                          {"note", noteText},
                          {"type", typeName}};
  TANDEM_RETURN_IF_ERROR(client_.create(eventsResource(), ns, event).status());
  absl::MutexLock lock(&mu_);
  if (series_.size() >= kMaxSeries) {  // forget series whose window closed
    absl::erase_if(series_, [&](const auto& entry) { return now - entry.second.lastSeen >= options_.seriesWindow; });
  }
  series_[key] = Series{eventName, ns, 1, now};
  return absl::OkStatus();
}

}  // namespace tandem::k8s
