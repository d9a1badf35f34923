#pragma once
// Records events.k8s.io/v1 Events about objects, as controllers do.
//
//   EventRecorder recorder(client, {.reportingController = "serving.tandem.dev/operator",
//                                   .reportingInstance = podName});
//   recorder.record(ObjectReference::of(pool), EventType::kNormal, "ScaledUp", "Scale", "decode 2 → 3");
//
// The Event: regarding (the object), reason (CamelCase), note, type
// Normal|Warning, action, reportingController, reportingInstance, eventTime.
// The same (regarding, type, reason, action, note) again within
// `seriesWindow` does not create a new Event: the existing one gets a
// `series` {count, lastObservedTime} by merge patch (events.k8s.io semantics).
// Calls are synchronous (one request). Errors are returned; controllers
// usually log and go on.
//
// Thread-safety: record() may be called from any thread.

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "src/common/clock.h"
#include "src/k8s/client.h"

namespace tandem::k8s {

struct ObjectReference {
  std::string apiVersion;
  std::string kind;
  std::string ns;
  std::string name;
  std::string uid;
  std::string resourceVersion;

  static ObjectReference of(const nlohmann::json& object);
  nlohmann::json toJson() const;
};

enum class EventType { kNormal, kWarning };

struct EventRecorderOptions {
  std::string reportingController;  // "serving.tandem.dev/operator"
  std::string reportingInstance;    // the pod name
  Duration seriesWindow = std::chrono::minutes(6);
  const Clock* clock = nullptr;  // not owned; default SystemClock::instance()
};

class EventRecorder {
 public:
  // `client` must outlive the recorder.
  EventRecorder(Client& client, EventRecorderOptions options);

  absl::Status record(const ObjectReference& regarding, EventType type, std::string_view reason,
                      std::string_view action, std::string_view note);

 private:
  struct Series {
    std::string eventName;
    std::string ns;
    int64_t count = 1;
    MonoTime lastSeen;
  };

  Client& client_;
  const EventRecorderOptions options_;
  const Clock& clock_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Series> series_ ABSL_GUARDED_BY(mu_);
  int64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::k8s
