#pragma once
// The planner's decision (docs/planner.md): from one interval's signals of a
// pool, how many prefill and decode replicas it should have and why. Pure:
// no clock, no I/O. Time is seconds on any monotonic axis the caller keeps
// (the operator's clock, the simulator's simulated time), so the operator,
// tandem-sim and the tests run exactly the same code.
//
// The model, per role, is sized on the forecast demand and then corrected
// by what the SLOs show:
//
//   prefill  demand  = uncached prompt tokens/s forecast at now + start-up
//                      time (a rising trend is extrapolated over the time a
//                      new replica takes to serve) + the queued prompt
//                      tokens drained within two intervals of the new
//                      replicas being up
//            needed  = demand × correction / (capacity per replica × utilisation)
//            where capacity is measured on warm replicas only, utilisation
//            = 1 / (1 + headroom), and correction = observed TTFT p95 ÷ the
//            model's TTFT at the current size (kept as an average, 1..4)
//   decode   needed  = max(KV:   blocks of running sequences and of recently
//                                active sessions / (1 − minFreeKvRatio) per replica,
//                          TPOT: running sequences / the batch one replica
//                                serves within the TPOT target, from the
//                                measured TPOT at the measured batch)
//            and, full with requests waiting (its demand censored), as a
//            flow: (requests/s + the waiting ones when new replicas are up
//            ÷ interval) × the KV block-seconds one request holds (measured
//            while decode kept up, stretched by the TPOT since); prefill
//            counts the same waiting requests' prompts as its backlog
//
// Stability: a scale-down is planned with the whole load on the survivors
// and a stricter utilisation (utilisation × (1 − scaleDownMargin)), so the
// replica count that scaling up reaches is never the one scaling down
// leaves (no N ↔ N−1 flapping); it goes no lower than the highest need of
// the last scaleDownCooldown (bursty load is sized for its bursts, not for
// the quiet interval between two); never while the role's SLO is missed. Steps
// are bounded, cooldowns are per direction, replicas still starting count as
// capacity on the way, and a role with an unschedulable replica is never
// grown. With a GPU budget, while neither role misses its SLO each gets the
// same share of what it wants; otherwise the role under less pressure
// (observed ÷ target) gives way. Missing or stale signals: no action, and
// the decision names the series.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tandem::planner {

enum class PlanRole { kPrefill, kDecode };
inline constexpr PlanRole kPlanRoles[] = {PlanRole::kPrefill, PlanRole::kDecode};
const char* planRoleName(PlanRole role);  // "prefill", "decode"

struct Bounds {
  int32_t min = 1;
  int32_t max = 1000;
};

// Routing knobs the planner publishes to the routers (router_config.h);
// the defaults are the routers' own.
struct RoutingKnobs {
  int64_t direct_max_suffix_tokens = 2048;
  double load_floor_weight = 1.5;
  // The admission watermark: a prefill replica with more queued uncached
  // prompt tokens than this is passed over while another is below it
  // (by the routers).
  int64_t prefill_overload_tokens = 65536;
  bool operator==(const RoutingKnobs&) const = default;
};

struct PlannerConfig {
  double ttft_target_s = 4.0;   // TTFT p95 as clients see it (queueing included)
  double tpot_target_s = 0.05;  // TPOT p95
  double min_free_kv_ratio = 0.1;
  Bounds prefill, decode;
  int32_t gpus_per_prefill = 1, gpus_per_decode = 1;
  int64_t gpu_budget = 0;  // 0: none
  // After a scale-up, more is added no sooner than scale_up_cooldown_s and
  // nothing is removed before scale_down_cooldown_s; after a scale-down,
  // the next step down waits scale_up_cooldown_s. A scale-up never waits
  // for a scale-down's cooldown. No scale-up cooldown by default: replicas
  // still starting already count as capacity, so the next interval adds
  // only what they will not cover (waiting a minute more delays recovering
  // from a step by two intervals; tandem-sim, docs/benchmarks.md).
  double scale_up_cooldown_s = 0;
  // Also the stabilization window. 7.5 min, from tandem-sim
  // (docs/benchmarks.md): with 5 min, the Azure code trace at 512 GPUs
  // reversed a role more than once per 10 intervals (capacity given back in
  // the quiet between bursts was wanted at the next); with 10 min, 9,600
  // agentic sessions at 512 GPUs collapsed (prefill held from the even
  // start kept decode short of the growing working set).
  double scale_down_cooldown_s = 450;
  // Replicas a role may gain / lose in one decision; 0: up to doubling (at
  // least 4), down by at most half (at least one).
  int32_t max_step = 0;
  double headroom = 0.2;           // plan for (1 + headroom) × the demand
  double scale_down_margin = 0.2;  // scale down only with this much more room
  double interval_s = 30;          // how often the planner decides
  // Between two intervals, growth is checked this often (checkScaleUp): a
  // step in load is met up to an interval sooner, while shrinking and the
  // routing knobs stay with the intervals. 0: no checks between intervals.
  double scale_up_check_s = 10;
  double startup_s = 60;           // a new replica's start-up time until one was measured
  double warmup_s = 60;            // a replica Ready for less than this is warming: its capacity is not measured
  double max_signal_age_s = 120;   // older signals are stale
  // The pool's own values of the knobs (spec.router.policy), which the
  // published ones scale.
  RoutingKnobs base_knobs;
  // spec.router.policy.prefillOverloadTokens was set: the watermark is the
  // pool's, published unchanged; otherwise the planner derives it from the
  // measured prefill capacity (prefillOverloadTokens below).
  bool prefill_overload_from_pool = false;
};

// InvalidArgument naming the field: targets > 0, ratios in [0, 1), bounds
// min <= max, cooldowns and times >= 0.
absl::Status validatePlannerConfig(const PlannerConfig& config);

// One replica of a role as the cluster and its metrics show it.
struct ReplicaSample {
  std::string name;
  bool ready = false;
  double ready_for_s = 0;      // since it became Ready
  bool unschedulable = false;  // Pending: no node can take it
  // Measured capacity: prefill, uncached prompt tokens computed per busy
  // second; decode, nothing (its TPOT and batch are pool signals).
  // nullopt: no sample this interval (idle, or no series).
  std::optional<double> capacity;
};

// One interval's signals of a pool. A value is nullopt when the series had
// no data because nothing happened (no requests); a series that should be
// there and is not is named in `missing` instead.
struct Signals {
  double at_s = 0;  // when the signals were read (the caller's time axis)
  double age_s = 0;  // how old the newest sample behind them is
  std::vector<std::string> missing;  // series absent or stale: nothing is decided
  // Client-side latency (router histograms: queueing included).
  std::optional<double> ttft_p95_s, tpot_p95_s;
  // Prefill.
  double uncached_prompt_tokens_per_s = 0;  // arriving
  double prefill_queue_tokens = 0;          // queued now, over all prefill replicas
  // Its peak over the interval's scrapes: the KV decode held for a backlog
  // is discounted at the peak, as decode's KV ratio is read at its peak.
  double prefill_queue_peak_tokens = 0;
  double mean_uncached_prompt_tokens = 0;   // per request (for the TTFT model)
  // Decode.
  // KV reserved by running sequences, mean over Ready decode replicas.
  double decode_kv_used_ratio = 0;
  // The working set: running sequences plus the sessions resident that had
  // a turn within the last few minutes. Shrinking below it evicts sessions
  // that come back, whose prompts are then computed again.
  double decode_kv_active_ratio = 0;
  double decode_running = 0;        // sequences decoding now, all decode replicas
  double decode_waiting = 0;        // requests waiting for KV to be admitted on D (peak)
  // The decode replicas' KV pool in blocks (Ready ones) and the tokens per
  // block: D reserves a request's blocks before its prompt is computed, so
  // the prefill queue holds decode KV that more decode replicas would not
  // free (0: unknown, nothing is discounted).
  double decode_kv_total_blocks = 0;
  double kv_block_tokens = 0;
  // Requests arriving (the routers' decisions): decode's flow (KV
  // block-seconds per request) is measured and sized on it.
  double requests_per_s = 0;
  // Reported for status and metrics (and read by other policies tandem-sim
  // compares); the decision does not size on them.
  double generation_tokens_per_s = 0;
  double preemptions_per_s = 0;
  double fallback_share = 0;  // requests that fell back to monolithic or were rejected
  std::vector<ReplicaSample> prefill, decode;  // one per replica of the spec (Ready or not)
  int32_t spec_prefill = 0, spec_decode = 0;   // spec.*.replicas now
};

enum class Reason {
  kHold,             // nothing to change
  kScaleUp,          // demand forecast (or an SLO) needs more
  kScaleDown,        // the survivors carry the load with margin
  kMissingData,      // a series absent or stale
  kCooldown,         // a change is needed but its direction's cooldown runs
  kUnschedulable,    // would grow, but a replica cannot be placed
  kSloMissed,        // would shrink, but the role's SLO is missed now
  kBudget,           // the GPU budget cut the change
  kManualOverride,   // spec differs from what the planner last wrote
  kBounds,           // min/max moved it
};
const char* reasonName(Reason reason);  // "ScaleUp", ...
// Every reason, for metrics that show each from the start.
inline constexpr Reason kReasons[] = {Reason::kHold,          Reason::kScaleUp,       Reason::kScaleDown,
                                      Reason::kMissingData,   Reason::kCooldown,      Reason::kUnschedulable,
                                      Reason::kSloMissed,     Reason::kBudget,        Reason::kManualOverride,
                                      Reason::kBounds};

struct RoleDecision {
  int32_t current = 0;  // spec replicas when decided
  int32_t desired = 0;
  Reason reason = Reason::kHold;
  std::string message;  // one sentence: the numbers behind it
  // Inputs as used (for status.lastScaling and metrics).
  double needed = 0;     // the model's replicas before steps, cooldowns and bounds
  double capacity = 0;   // per replica (prefill: tokens/s; decode: sequences within TPOT)
  double pressure = 0;   // observed ÷ target of the role's SLO (0: no data)
  double correction = 1; // prefill's SLO correction
  // Overloaded now, not only by the forecast: its SLO missed, or (prefill)
  // arrivals beyond what its Ready replicas compute or a queue beyond what
  // they compute within the TTFT target, or (decode) its KV full with
  // requests waiting to be admitted.
  bool overloaded = false;
};


struct Decision {
  RoleDecision prefill, decode;
  RoutingKnobs knobs;
  bool acted() const { return prefill.desired != prefill.current || decode.desired != decode.current; }
  const RoleDecision& role(PlanRole r) const { return r == PlanRole::kPrefill ? prefill : decode; }
  RoleDecision& role(PlanRole r) { return r == PlanRole::kPrefill ? prefill : decode; }
};

// What the planner remembers between intervals of one pool.
struct PlannerState {
  struct RoleState {
    std::optional<double> last_up_s, last_down_s;  // last scaling in each direction
    std::optional<double> manual_until_s;          // a user's replicas stand until then
    int32_t written = -1;                          // replicas the planner last wrote; -1: none
    std::optional<double> capacity;                // remembered per-replica capacity (warm replicas)
    // Decode: KV blocks held per request per second of arrivals (the KV in
    // use ÷ the request rate, Little's law: blocks a request holds × how
    // long it holds them), learned from settled intervals where decode
    // admitted every request (learnDecodeFlow in planner.cc); it sizes a
    // full pool whose demand the ratio cannot show.
    // The TPOT p95 they were measured at: a request decodes longer, and
    // holds its KV longer, as the batch grows.
    std::optional<double> kv_block_seconds;
    double kv_tpot_s = 0;
    double correction = 1;
    int32_t last_direction = 0;  // +1 / −1 of its last step (for reversals)
    // (time, replicas the model allowed shrinking to): a scale-down goes no
    // lower than the highest of these over the last scale_down_cooldown_s.
    std::vector<std::pair<double, double>> recent_down;
  };
  RoleState prefill, decode;
  // When the planner first decided for the pool: nothing is scaled down
  // before it has seen one stabilization window (scale_down_cooldown_s) of load.
  std::optional<double> since_s;
  // Recent (time, uncached prompt tokens/s) and (time, decode working set
  // ratio), for their trends.
  std::vector<std::pair<double, double>> arrivals, kv_active;
  // Recent (decode batch per replica, TPOT p95), for the TPOT line.
  std::vector<std::pair<double, double>> tpot_samples;
  RoleState& role(PlanRole r) { return r == PlanRole::kPrefill ? prefill : decode; }
  const RoleState& role(PlanRole r) const { return r == PlanRole::kPrefill ? prefill : decode; }
};

// Decides one interval and updates `state` (remembered capacity,
// correction, trend, cooldown clocks) as if the decision is applied; the
// caller writes the desired replicas with field manager tandem-planner.
Decision decide(const PlannerConfig& config, const Signals& signals, PlannerState& state);

// A check between two intervals (every config.scale_up_check_s): the same
// decision from the signals read now, acted on only where a role grows
// and is overloaded now (a forecast alone waits for the interval: bursts
// seen in part of an interval would otherwise be chased, and given back
// later), and where the GPU budget cuts the other role to make room for that;
// every other change waits for the next interval (held, reason kHold).
// `state` changes only by the growth it acts on (the cooldown clocks, the
// replicas written): trends, measured capacity, the SLO correction and the
// stabilization window are the intervals' own. The routing knobs it returns
// are not meant to be published (the intervals publish them).
Decision checkScaleUp(const PlannerConfig& config, const Signals& signals, PlannerState& state);

// The routing knobs for a decision's pressures, scaling `base`.
RoutingKnobs routingKnobs(double prefill_pressure, double decode_pressure, const RoutingKnobs& base = {});

// The admission watermark for a prefill replica that computes
// `capacity_tokens_per_s` uncached prompt tokens per busy second: the queue
// it clears in half the TTFT target (a request queued behind more is likely
// to miss the target there while another replica has room), at least
// kMinPrefillOverloadTokens so that one ordinary prompt never marks a replica;
// two significant figures (the ConfigMap is written when a knob changes).
inline constexpr int64_t kMinPrefillOverloadTokens = 2048;
int64_t prefillOverloadTokens(double capacity_tokens_per_s, double ttft_target_s);

}  // namespace tandem::planner
