#pragma once
// Which decode pod goes first on scale-down (docs/operator.md "Graceful
// scale-down"): the operator keeps each decode pod's
// `controller.kubernetes.io/pod-deletion-cost` current from what the agent
// itself reports on /metrics, and the ReplicaSet controller removes the
// cheapest pod first. Requests in flight weigh most (the agent would have
// to drain them), then resident sessions (their KV would have to be
// computed again on another decode agent).
//
// Pure.

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::op {

inline constexpr const char* kDeletionCostAnnotation = "controller.kubernetes.io/pod-deletion-cost";

struct DecodeLoad {
  int64_t running = 0;   // tandem_requests_running
  int64_t waiting = 0;   // tandem_requests_waiting
  int64_t sessions = 0;  // tandem_sessions_resident
};

// The agent's Prometheus text: each gauge summed over its series.
// InvalidArgument when none of the three is there (not a decode agent's metrics).
absl::StatusOr<DecodeLoad> parseDecodeLoad(std::string_view metrics_text);

// (running + waiting) * 1000 + sessions, within int32 (the annotation's range).
int32_t deletionCost(const DecodeLoad& load);

}  // namespace tandem::op
