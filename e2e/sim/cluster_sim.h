#pragma once
// tandem-sim's core (docs/planner.md, "Simulator"): a prefill/decode cluster
// in simulated time, routed by the router's own policy (src/routing, fed
// worker-state deltas as the router role is) and sized every interval by a
// scaling policy that sees the same signals the operator's planner reads
// from Prometheus (operator/planner/planner.h's Signals).
//
// The engines are models, not measurements (EngineModel below; every
// number is a flag):
//   prefill   a FIFO queue per replica; a request takes overhead + its
//             uncached tokens / prefill_tokens_per_s (a replica still
//             warming computes at warmup_speed of that); its prompt blocks
//             stay in the replica's prefix cache (LRU)
//   transfer  the prompt blocks D does not hold, kv_transfer_s_per_block each
//   decode    a KV pool per replica (reservations, prefix cache and resident
//             sessions as the engine keeps them: e2e/replay/worker_kv.h);
//             every sequence in the batch advances one token per step of
//             tpot_base_s + tpot_per_seq_s × batch (processor sharing)
//   direct    a turn routed direct-to-D is computed on D's own prefill lane
//   replicas  Ready start-up_s after they are asked for; removed ones stop
//             taking work at once and leave when their work is done
//
// Deterministic: the same inputs give the same result.

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "e2e/replay/replay_input.h"
#include "operator/planner/planner.h"

namespace tandem::sim {

struct EngineModel {
  double prefill_tokens_per_s = 16000;  // uncached prompt tokens per second, one warm prefill replica
  double prefill_overhead_s = 0.02;     // per prompt
  double tpot_base_s = 0.012;           // one decode step with one sequence
  double tpot_per_seq_s = 0.0004;       // added per sequence in the batch
  int64_t kv_blocks = 512;              // per decode replica, 512-token blocks
  int64_t prefill_cache_blocks = 1024;  // per prefill replica
  double kv_transfer_s_per_block = 0.002;
  int max_waiting = 512;  // requests queued at a decode replica beyond this are refused
  double startup_s = 120;
  double warmup_s = 60;
  double warmup_speed = 0.5;
  int gpus_per_prefill = 1, gpus_per_decode = 1;
};

struct Slo {
  double ttft_s = 4;
  double tpot_s = 0.05;
};

struct PoolSize {
  int32_t prefill = 1, decode = 1;
};

// What sizes the pool: asked once at the start and then every interval.
class ScalingPolicy {
 public:
  virtual ~ScalingPolicy() = default;
  virtual std::string name() const = 0;
  virtual PoolSize initial() const = 0;
  // The size it wants now, from this interval's signals.
  virtual PoolSize decide(const planner::Signals& signals) = 0;
  // Why, for --log ("" when the policy does not say).
  virtual std::string why() const { return ""; }
  // Checks between two intervals, this often (0: none): a size to go to,
  // from the signals of the interval so far, or nullopt to keep the pool.
  virtual double checkEvery() const { return 0; }
  virtual std::optional<PoolSize> check(const planner::Signals&) { return std::nullopt; }
};

struct SimOptions {
  EngineModel engine;
  Slo slo;
  double interval_s = 30;
  double scrape_s = 5;  // gauges are sampled this often; the planner sees each interval's peak
  std::ostream* log = nullptr;  // each interval's signals and the size asked for, one line
};

struct SimResult {
  std::string policy;
  int64_t requests = 0;  // in the trace
  int64_t met = 0;       // served within both SLOs
  int64_t dropped = 0;   // refused by every decode replica tried, or too long for any
  double slo_attainment = 0;  // met / requests
  double goodput = 0;         // met requests per second of the trace
  double gpu_hours = 0;       // GPUs held (starting, serving, draining) over time
  int64_t actions = 0;        // scaling steps (one per role that changed)
  int64_t reversals = 0;      // a role's step opposite to its previous step
  int64_t intervals = 0;
  double p95_ttft_s = 0, p95_tpot_s = 0;
  int32_t peak_prefill = 0, peak_decode = 0;
  double duration_s = 0;  // first arrival to last completion
  // SLO attainment of the requests that arrived in each interval (dropped
  // ones count as missed); -1 for an interval nobody arrived in.
  std::vector<double> attainment_by_interval;
};

// Runs `input` once under `policy`. Errors only when the simulation itself
// is broken (a delta the routing state refused).
[[nodiscard]] absl::StatusOr<SimResult> runSim(const replay::ReplayInput& input, const SimOptions& options,
                                               ScalingPolicy& policy);

}  // namespace tandem::sim
