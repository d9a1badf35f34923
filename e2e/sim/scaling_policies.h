#pragma once
// The scaling policies tandem-sim compares (docs/planner.md, "Simulator"):
//
//   static:P:D  a fixed pool
//   interval    a throughput-interval planner in the style of the best-known
//               one: every interval, the last interval's demand divided by a
//               profiled per-replica throughput (prefill tokens/s; decode
//               tokens/s at the batch that meets the TPOT target or that
//               its KV holds at the observed context), scaled by a
//               correction factor (observed ÷ profiled latency); no
//               cooldowns, no forecast, capacity read from every replica
//   tandem      the operator's planner (operator/planner), unchanged
//
// Each is held to the run's GPU budget (--gpus).

#include <memory>
#include <string>

#include "e2e/sim/cluster_sim.h"
#include "operator/planner/planner.h"

namespace tandem::sim {

std::unique_ptr<ScalingPolicy> staticPolicy(PoolSize size);

struct IntervalOptions {
  EngineModel profile;  // what the planner's profiling measured (the engine model itself)
  Slo slo;
  int64_t gpu_budget = 0;
  PoolSize initial;
};
std::unique_ptr<ScalingPolicy> intervalPolicy(const IntervalOptions& options);

struct TandemOptions {
  planner::PlannerConfig config;
  PoolSize initial;
};
std::unique_ptr<ScalingPolicy> tandemPolicy(const TandemOptions& options);

}  // namespace tandem::sim
