#pragma once
// What the kubelet's pod loop decides about a container's health, as pure
// state on the time it is given (docs/local-cluster.md): its probes'
// verdicts and its restart back-off, with Kubernetes' rules and defaults.
//
// Probes (readiness and liveness; httpGet, tcpSocket and exec alike, the
// caller runs them): none before `initial_delay` after the container
// started, then one every `period`; `success_threshold` successes in a row
// make it ready (readiness starts not ready), `failure_threshold` failures in
// a row make it not ready (readiness) or due for a restart (liveness, which
// starts alive). A probe that took longer than `timeout` is a failure.
//
// Restarts: CrashLoopBackOff's delay, 10 s after the first exit, doubling to
// 5 min; a container that ran 10 min before it exited starts over at 10 s.
//
// Not thread-safe; no clock of its own.

#include "absl/status/statusor.h"
#include "src/common/clock.h"

namespace tandem::kubelet {

struct ProbeSpec {
  Duration initial_delay{0};
  Duration period = std::chrono::seconds(10);
  Duration timeout = std::chrono::seconds(1);
  int success_threshold = 1;
  int failure_threshold = 3;
};

enum class ProbeKind { kReadiness, kLiveness };

// InvalidArgument naming the field for what the API server would refuse: a
// negative initial delay, a period or timeout that is not positive
// (Kubernetes counts whole seconds; tests here probe faster), thresholds
// under 1, or a liveness success_threshold other than 1.
absl::Status validateProbe(ProbeKind kind, const ProbeSpec& spec);

class ProbeTracker {
 public:
  // The container started at `started`.
  ProbeTracker(ProbeKind kind, const ProbeSpec& spec, MonoTime started);

  // When the next probe is due.
  MonoTime nextProbe() const { return next_; }
  // A probe that began at `began` and answered (`success`) at `now`. True
  // when the verdict changed.
  bool record(bool success, MonoTime began, MonoTime now);

  bool ready() const { return ready_; }    // readiness verdict
  bool failed() const { return failed_; }  // liveness: restart the container

 private:
  const ProbeKind kind_;
  const ProbeSpec spec_;
  MonoTime next_;
  int successes_ = 0;  // in a row
  int failures_ = 0;   // in a row
  bool ready_ = false;
  bool failed_ = false;
};

class RestartBackoff {
 public:
  static constexpr Duration kInitial = std::chrono::seconds(10);
  static constexpr Duration kMax = std::chrono::minutes(5);
  static constexpr Duration kReset = std::chrono::minutes(10);

  // The container that started at `started` exited at `exited`: how long
  // to wait before starting it again. Counts the restart.
  Duration onExit(MonoTime started, MonoTime exited);
  int restartCount() const { return restarts_; }

 private:
  Duration next_ = kInitial;
  int restarts_ = 0;
};

}  // namespace tandem::kubelet
