#include "e2e/kubelet/pod_health.h"

#include <algorithm>

#include "src/common/strings.h"

namespace tandem::kubelet {

absl::Status validateProbe(ProbeKind kind, const ProbeSpec& spec) {
  const char* which = kind == ProbeKind::kReadiness ? "readinessProbe" : "livenessProbe";
  auto bad = [&](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(strCat(which, ".", field, ": ", why));
  };
  if (spec.initial_delay < Duration(0)) return bad("initialDelaySeconds", "must not be negative");
  if (spec.period < std::chrono::milliseconds(1)) return bad("periodSeconds", "must be positive");
  if (spec.timeout < std::chrono::milliseconds(1)) return bad("timeoutSeconds", "must be positive");
  if (spec.success_threshold < 1) return bad("successThreshold", "must be at least 1");
  if (spec.failure_threshold < 1) return bad("failureThreshold", "must be at least 1");
  if (kind == ProbeKind::kLiveness && spec.success_threshold != 1) return bad("successThreshold", "must be 1");
  return absl::OkStatus();
}

ProbeTracker::ProbeTracker(ProbeKind kind, const ProbeSpec& spec, MonoTime started)
    : kind_(kind), spec_(spec), next_(started + spec.initial_delay) {}

bool ProbeTracker::record(bool success, MonoTime began, MonoTime now) {
  success = success && now - began <= spec_.timeout;
  next_ = std::max(next_, began) + spec_.period;
  const bool readiness = kind_ == ProbeKind::kReadiness;
  const bool before = readiness ? ready_ : failed_;
  if (success) {
    failures_ = 0;
    ++successes_;
    if (readiness && successes_ >= spec_.success_threshold) ready_ = true;
  } else {
    successes_ = 0;
    ++failures_;
    if (failures_ >= spec_.failure_threshold) {
      // Not ready; or, for liveness, due for a restart (this tracker's
      // container is over: the restarted one gets a new tracker).
      if (readiness) {
        ready_ = false;
      } else {
        failed_ = true;
      }
    }
  }
  return (readiness ? ready_ : failed_) != before;
}

Duration RestartBackoff::onExit(MonoTime started, MonoTime exited) {
  ++restarts_;
  if (exited - started >= kReset) next_ = kInitial;
  const Duration delay = next_;
  next_ = std::min<Duration>(next_ * 2, kMax);
  return delay;
}

}  // namespace tandem::kubelet
