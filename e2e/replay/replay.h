#pragma once
// One policy on one trace and worker model, in simulated time: the core of
// tandem-replay (docs/routing.md, "Replay").
//
// Events, in time order (ties in the order they were scheduled):
//   arrival       the policy routes the request (route(), onAssigned()); the
//                 worker queues it or refuses it with a typed reason
//                 (onRejected(), and the request is routed again, at most
//                 kMaxAttempts times in all);
//   admission     the worker's prefill is free and the head of its queue fits
//                 its KV reservation: the request's wait ends, its prefill
//                 starts, and it leaves the router's in-flight view;
//   prefill done  its prompt blocks become known to routers; it decodes;
//   decode done   onFinished(); its KV stays resident or cached.
// Workers publish every change to the policy's ClusterState as worker-state
// deltas at once. Nothing reads a clock: the same inputs give the same result.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "e2e/replay/replay_input.h"
#include "e2e/replay/sim_worker.h"
#include "src/routing/policy.h"

namespace tandem::replay {

// A request refused this many times (by any workers) is dropped.
inline constexpr int kMaxAttempts = 3;
// A worker that served fewer than this share of the mean requests per worker is cold.
inline constexpr double kColdWorkerShare = 0.25;

struct ReplayResult {
  std::string policy;
  int64_t requests = 0;  // served
  int64_t dropped = 0;   // refused kMaxAttempts times, or no worker could ever take it
  // Prompt blocks found on the serving worker at admission / all prompt blocks served.
  double hit_ratio = 0;
  double hit_bound = 0;  // the same with one unbounded cache (ReplayInput::hit_bound)
  double imbalance = 0;  // max / mean of requests served per worker
  // Arrival to admission (queueing for the worker's prefill and for KV room).
  double p50_wait_s = 0;
  double p99_wait_s = 0;
  // Of the requests with turn >= 1 of a session, the share served
  // direct-to-D: the session was resident on the serving worker and its
  // uncached suffix at most direct_max_suffix_tokens. nullopt: no such request.
  std::optional<double> direct_share;
  std::optional<double> min_session_direct_share;  // the lowest per-session share
  int64_t cold_workers = 0;                        // kColdWorkerShare
  int64_t rejections = 0;                          // refusals by workers (each attempt counts)
  // Turns >= 1 served by another worker than their session's previous turn
  // (the session's KV is left behind).
  int64_t migrations = 0;
};

// Runs `policy` from a fresh state: `num_workers` workers of `model`, an
// empty ClusterState and InFlight. Errors only if the replay itself is broken
// (a delta the ClusterState refused, a decision naming an unknown worker).
[[nodiscard]] absl::StatusOr<ReplayResult> runReplay(const ReplayInput& input, int num_workers,
                                                     const WorkerModel& model, routing::Policy& policy);

}  // namespace tandem::replay
