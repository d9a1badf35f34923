#include "operator/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "src/common/strings.h"
#include "src/routing/router_config.h"

namespace tandem::planner {
namespace {

// Trend samples kept (one per interval).
constexpr size_t kTrendSamples = 6;
// (batch, TPOT) samples kept for decode's TPOT line.
constexpr size_t kTpotSamples = 12;
// A forecast never exceeds this multiple of the current rate.
constexpr double kMaxForecastGrowth = 2.0;
// The prefill correction's range and smoothing.
constexpr double kMaxCorrection = 4.0;
constexpr double kCorrectionSmoothing = 0.5;
// Below this utilisation the TTFT model is trusted for the correction.
constexpr double kMaxModelUtilisation = 0.95;
// No role is sized beyond this many replicas.
constexpr int32_t kMaxReplicas = 100000;
// The TTFT feedback asks for at most this many times the replicas utilisation needs.
constexpr int32_t kMaxSloFactor = 4;
// Decode's KV block-seconds per request are learned from intervals with at
// least this many requests (a trickle while long sequences hold KV would
// read as enormous block-seconds).
constexpr double kMinFlowRequests = 20;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

const Bounds& boundsOf(const PlannerConfig& c, PlanRole r) { return r == PlanRole::kPrefill ? c.prefill : c.decode; }
int32_t gpusOf(const PlannerConfig& c, PlanRole r) {
  return r == PlanRole::kPrefill ? c.gpus_per_prefill : c.gpus_per_decode;
}
const std::vector<ReplicaSample>& samplesOf(const Signals& s, PlanRole r) {
  return r == PlanRole::kPrefill ? s.prefill : s.decode;
}
int32_t specOf(const Signals& s, PlanRole r) { return r == PlanRole::kPrefill ? s.spec_prefill : s.spec_decode; }

int32_t readyCount(const std::vector<ReplicaSample>& samples) {
  return static_cast<int32_t>(std::count_if(samples.begin(), samples.end(), [](const auto& r) { return r.ready; }));
}

// Ceil with a tolerance, so 3.0000000001 replicas is 3.
int32_t replicasFor(double needed) {
  return static_cast<int32_t>(std::min(1e6, std::max(0.0, std::ceil(needed - 1e-9))));
}

// A series' value expected `horizon_s` from now (the time a replica added
// now takes to serve). A rise over two consecutive intervals is a trend:
// it is extrapolated at the smaller of the two rises. A single jump (a
// step) is not extrapolated, and neither is a fall (scale-down waits for
// it to show).
double forecast(std::vector<std::pair<double, double>>& series, double now, double value, double horizon_s) {
  series.emplace_back(now, value);
  if (series.size() > kTrendSamples) series.erase(series.begin());
  const size_t n = series.size();
  if (n < 3) return value;
  const auto& [t0, r0] = series[n - 3];
  const auto& [t1, r1] = series[n - 2];
  const auto& [t2, r2] = series[n - 1];
  if (!(t1 > t0 && t2 > t1 && r1 > r0 && r2 > r1)) return value;
  const double slope = std::min((r1 - r0) / (t1 - t0), (r2 - r1) / (t2 - t1));
  return std::min(value + slope * horizon_s, value * kMaxForecastGrowth);
}

// What the model says a role needs: growing to `up` replicas keeps the
// planned utilisation; shrinking is allowed down to `down` (the whole load
// on the survivors, with the margin).
struct Need {
  double up = 0, down = 0;
  double capacity = 0;
  double pressure = 0;
  bool slo_missed = false;
  std::string why;
  // Prefill: the pressure of the TTFT its own queue and compute explain
  // (the model's TTFT, corrected, ÷ target), and whether it is behind: its
  // queue more than it computes within the TTFT target, or the arrivals
  // more than its Ready replicas compute.
  double own_pressure = 0;
  bool behind = false;
  // Decode: full, with requests waiting to be admitted; and then the
  // replicas its flow needs (0: not sized as a flow).
  bool full_with_waiting = false;
  double flow = 0;
};

// Least squares line through (x, y) samples: (intercept, slope), or
// nullopt when the x values span less than a fifth of their mean.
std::optional<std::pair<double, double>> fitLine(const std::vector<std::pair<double, double>>& samples) {
  if (samples.size() < 3) return std::nullopt;
  double mx = 0, my = 0, lo = samples[0].first, hi = lo;
  for (const auto& [x, y] : samples) mx += x, my += y, lo = std::min(lo, x), hi = std::max(hi, x);
  mx /= static_cast<double>(samples.size());
  my /= static_cast<double>(samples.size());
  if (hi - lo < 0.2 * mx) return std::nullopt;
  double sxy = 0, sxx = 0;
  for (const auto& [x, y] : samples) sxy += (x - mx) * (y - my), sxx += (x - mx) * (x - mx);
  const double slope = sxy / sxx;
  return std::make_pair(my - slope * mx, slope);
}

// The model's TTFT with `n` replicas: the mean prompt's compute time
// stretched by the queueing at utilisation rate / (n × cap) (M/M/1), plus
// draining the queued tokens with the capacity left over. Infinite when the
// arrivals alone fill the replicas.
double modelTtft(double n, double rate, double queue, double mean_prompt, double cap) {
  const double rho = rate / (n * cap);
  if (rho >= 1) return std::numeric_limits<double>::infinity();
  return (mean_prompt / cap) / (1 - rho) + queue / (n * cap - rate);
}

// The share of decode's KV (0..used) that D reserved for prompts queued
// for prefill beyond what the prefill replicas compute within the TTFT
// target: a prefill backlog's (more prefill replicas clear it; more decode
// replicas would not free it). What prefill holds in flight in steady state
// is decode's to hold.
double kvHeldForPrefillBacklog(const PlannerConfig& c, const Signals& s, const PlannerState& state) {
  if (!(s.decode_kv_total_blocks > 0) || !(s.kv_block_tokens > 0)) return 0;
  const double in_flight = state.prefill.capacity.value_or(0) * std::max(1, readyCount(s.prefill)) * c.ttft_target_s;
  const double queued = std::max(s.prefill_queue_tokens, s.prefill_queue_peak_tokens);
  const double excess = std::max(0.0, queued - in_flight);
  return std::min(s.decode_kv_used_ratio, excess / s.kv_block_tokens / s.decode_kv_total_blocks);
}

// Decode's KV full, with requests waiting to be admitted.
bool decodeFullWithWaiting(const PlannerConfig& c, const Signals& s, double backlog) {
  return s.decode_kv_used_ratio - backlog >= 1 - c.min_free_kv_ratio && s.decode_waiting > 0;
}

// A full decode pool sized as a flow (Little's law): the requests that must
// pass per second (the arrivals, plus those waiting by the time replicas
// added now are up, drained within one interval of that) × the KV
// block-seconds one request holds now (as measured while decode admitted
// every request, stretched by how much longer a token takes now: the TPOT
// p95 against the one it was measured at).
struct DecodeFlow {
  double waiting_when_up = 0;  // requests
  double replicas = 0;
};

// nullopt when decode is not full with requests waiting or its
// block-seconds were not measured.
std::optional<DecodeFlow> decodeFlow(const PlannerConfig& c, const Signals& s, const PlannerState& state,
                                     double backlog) {
  const PlannerState::RoleState& rs = state.decode;
  const int32_t ready = std::max(1, readyCount(s.decode));
  if (!decodeFullWithWaiting(c, s, backlog) || !rs.kv_block_seconds || !(rs.kv_tpot_s > 0) ||
      !(s.decode_kv_total_blocks > 0) || !(s.requests_per_s > 0)) {
    return std::nullopt;
  }
  const double stretch = s.tpot_p95_s ? std::max(1.0, *s.tpot_p95_s / rs.kv_tpot_s) : 1.0;
  const double per_request = *rs.kv_block_seconds * stretch;
  const double kv_room = 1 - c.min_free_kv_ratio;
  const double admitted = s.decode_kv_total_blocks * kv_room / per_request;  // requests/s the Ready pool admits
  DecodeFlow f;
  f.waiting_when_up = s.decode_waiting + std::max(0.0, s.requests_per_s - admitted) * c.startup_s;
  const double util = 1 / (1 + c.headroom);
  f.replicas = (s.requests_per_s + f.waiting_when_up / c.interval_s) * per_request /
               (s.decode_kv_total_blocks / ready * kv_room * util);
  if (!std::isfinite(f.replicas) || !std::isfinite(f.waiting_when_up)) return std::nullopt;
  return f;
}

// Learns decode's KV block-seconds per request (KV in use ÷ request rate)
// from an interval where decode admitted every request: none waiting, no
// KV held for a prefill backlog, every decode replica Ready and warm (the
// KV ratio's peak and the pool's blocks then describe the same replicas),
// enough requests to tell, TPOT known; averaged with what it was. (Not
// bounded per interval: a bound of 2x lagged the bursty Azure trace at
// 512 GPUs, 0.96 reversals per 10 intervals against 0.78.)
void learnDecodeFlow(const PlannerConfig& c, const Signals& s, double backlog, PlannerState::RoleState& rs) {
  const bool settled = std::all_of(s.decode.begin(), s.decode.end(), [&](const ReplicaSample& r) {
    return r.ready && r.ready_for_s >= c.warmup_s;
  });
  if (!settled || s.decode.empty() || backlog > 0 || s.decode_waiting > 0 || !s.tpot_p95_s || !(s.decode_running > 0) ||
      !(s.requests_per_s * c.interval_s >= kMinFlowRequests) || !(s.decode_kv_total_blocks > 0)) {
    return;
  }
  const double measured = s.decode_kv_used_ratio * s.decode_kv_total_blocks / s.requests_per_s;
  if (!std::isfinite(measured) || !(measured > 0) || !std::isfinite(*s.tpot_p95_s) || !(*s.tpot_p95_s > 0)) return;
  if (rs.kv_block_seconds) {
    rs.kv_block_seconds = 0.5 * *rs.kv_block_seconds + 0.5 * measured;
    rs.kv_tpot_s = 0.5 * rs.kv_tpot_s + 0.5 * *s.tpot_p95_s;
  } else {
    rs.kv_block_seconds = measured;
    rs.kv_tpot_s = *s.tpot_p95_s;
  }
}

Need prefillNeed(const PlannerConfig& c, const Signals& s, PlannerState& state, std::string& missing) {
  Need n;
  PlannerState::RoleState& rs = state.prefill;
  // Capacity from warm replicas only: a replica's first minutes (loading,
  // compiling, cold caches) are not what it will do.
  double sum = 0;
  int warm = 0;
  bool settling = false;  // replicas starting or warming: the SLO reflects a pool in transition
  for (const ReplicaSample& r : s.prefill) {
    if (!r.ready || r.ready_for_s < c.warmup_s) settling = true;
    if (r.ready && r.ready_for_s >= c.warmup_s && r.capacity && *r.capacity > 0) sum += *r.capacity, ++warm;
  }
  if (warm > 0) {
    const double measured = sum / warm;
    rs.capacity = rs.capacity ? 0.5 * *rs.capacity + 0.5 * measured : measured;
  }
  const double rate = forecast(state.arrivals, s.at_s, s.uncached_prompt_tokens_per_s, c.startup_s);
  // While prefill is behind (its queue is not empty), requests waiting on
  // decode for KV have not reached prefill yet: their prompts are prefill's
  // backlog too (a decode pool filled by a prefill backlog hides the rest
  // of that backlog from prefill's own queue). Counted for growing only: a
  // burst's peak of waiting requests does not hold prefill up for a
  // stabilization window, and with prefill idle the wait is decode's own.
  // Where decode's flow is measured (decodeFlow), they are counted as they
  // will be when new replicas are up (the waiting grows until decode's
  // are) and drained within one interval of that, the backlog decode is
  // sized for; otherwise as they are now, drained with the queue.
  const double queue = s.prefill_queue_tokens;
  const std::optional<DecodeFlow> flow =
      queue > 0 ? decodeFlow(c, s, state, kvHeldForPrefillBacklog(c, s, state)) : std::nullopt;
  const double hidden_when_up = flow ? flow->waiting_when_up * s.mean_uncached_prompt_tokens : 0;
  const double hidden = queue > 0 && !flow ? s.decode_waiting * s.mean_uncached_prompt_tokens : 0;
  if (s.ttft_p95_s) {
    n.pressure = *s.ttft_p95_s / c.ttft_target_s;
    n.slo_missed = n.pressure > 1;
  }
  if (!rs.capacity) {
    if (rate > 0 || queue > 0) missing = "prefill capacity (no warm prefill replica has computed a prompt yet)";
    n.why = "no prefill demand";
    return n;
  }
  const double cap = *rs.capacity;
  const double prompt = s.mean_uncached_prompt_tokens;
  n.capacity = cap;
  // SLO feedback: the observed TTFT against the model's at the size that
  // served it (not while replicas start or warm: the pool is in transition).
  const int32_t ready = std::max(1, readyCount(s.prefill));
  const double model_now = modelTtft(ready, s.uncached_prompt_tokens_per_s, queue, prompt, cap);
  if (s.ttft_p95_s && !settling && prompt > 0 && s.uncached_prompt_tokens_per_s / (ready * cap) < kMaxModelUtilisation) {
    const double observed = std::clamp(*s.ttft_p95_s / model_now, 1.0, kMaxCorrection);
    rs.correction = kCorrectionSmoothing * rs.correction + (1 - kCorrectionSmoothing) * observed;
  }
  // The fewest replicas whose utilisation stays planned and whose corrected
  // TTFT meets the target; for a scale-down, both with the margin.
  const double util = 1 / (1 + c.headroom);
  // A queue is drained within one interval of the replicas added for it
  // being up: every request behind it misses its TTFT until then, so the
  // SLO recovers within a few intervals (three after a 2x step with a 10 s
  // start-up; docs/benchmarks.md). Sizing to drain it within the TTFT
  // target would size for a backlog gone before the replicas are up.
  const double drain_s = std::max(c.ttft_target_s, c.startup_s + c.interval_s);
  // One prompt's compute time alone misses the target: no count of
  // replicas meets it (more replicas shorten queueing, not a prompt), so
  // prefill is sized on utilisation only. Otherwise the SLO feedback may ask
  // for at most kMaxSloFactor times what utilisation needs.
  const bool unreachable = prompt > 0 && prompt / cap >= c.ttft_target_s;
  auto fewest = [&](double margin, double backlog, double waiting) {
    if (rate <= 0 && backlog <= 0 && waiting <= 0) return 0.0;
    const double by_util = (rate + backlog / drain_s + waiting / c.interval_s) / (cap * util * margin);
    if (unreachable) return by_util;
    const int32_t base = std::max(1, replicasFor(by_util));
    const int32_t most = std::min(kMaxReplicas, base * kMaxSloFactor);
    int32_t k = base;
    while (k < most && rs.correction * modelTtft(k, rate, 0, prompt, cap) > c.ttft_target_s * margin) ++k;
    return k > replicasFor(by_util) ? static_cast<double>(k) : by_util;
  };
  n.own_pressure = std::isfinite(model_now) ? rs.correction * model_now / c.ttft_target_s : n.pressure;
  n.behind = queue > cap * ready * c.ttft_target_s || s.uncached_prompt_tokens_per_s > cap * ready;
  n.up = fewest(1, queue + hidden, hidden_when_up);
  n.down = fewest(1 - c.scale_down_margin, queue, 0);
  n.why = strCat(num(rate), " uncached tokens/s forecast + ", num(queue), " queued",
                 hidden > 0 ? strCat(" (+ ", num(hidden), " waiting on decode)") : std::string(),
                 hidden_when_up > 0 ? strCat(" (+ ", num(hidden_when_up),
                                             " waiting on decode when new replicas are up, drained within an interval)")
                                    : std::string(),
                 ", ", num(cap),
                 " tokens/s per replica, model TTFT ", num(model_now), " s x correction ", num(rs.correction),
                 unreachable ? "; one prompt alone takes longer than the TTFT target: sized on utilisation" : "");
  return n;
}

Need decodeNeed(const PlannerConfig& c, const Signals& s, PlannerState& state) {
  Need n;
  const int32_t ready = std::max(1, readyCount(s.decode));
  const double kv_room = 1 - c.min_free_kv_ratio;
  // KV held for a prefill backlog is discounted (kvHeldForPrefillBacklog).
  const double backlog = kvHeldForPrefillBacklog(c, s, state);
  // The working set grows as sessions start: its trend is planned for too.
  const double kv = forecast(state.kv_active, s.at_s,
                             std::max(s.decode_kv_used_ratio, s.decode_kv_active_ratio) - backlog, c.startup_s);
  // With the headroom: past the room, sessions are evicted and come back as
  // whole prompts for prefill (a cliff, not a slope).
  const double util = 1 / (1 + c.headroom);
  double kv_up = ready * kv / (kv_room * util);
  // Full, with requests waiting to be admitted: the demand is censored (a
  // full pool reads as "just full" however much more is asked), so it is
  // not estimated from the ratio. It is sized as a flow instead: the
  // requests that must pass through decode per second (the arrivals, plus
  // the waiting requests and what they grow by until new replicas are up,
  // drained within one interval after that) × the KV block-seconds one
  // request holds (measured while decode kept up). Without that
  // measurement the pool doubles.
  n.full_with_waiting = decodeFullWithWaiting(c, s, backlog);
  if (n.full_with_waiting) {
    // A flow the Ready pool already covers while it is full says the
    // measured block-seconds no longer hold (requests hold KV longer now):
    // the pool doubles then, as it does before they were measured.
    const std::optional<DecodeFlow> flow = decodeFlow(c, s, state, backlog);
    n.flow = flow && flow->replicas > ready ? flow->replicas : 0;
    kv_up = std::max(kv_up, n.flow > 0 ? n.flow : 2.0 * ready);
  } else {
    learnDecodeFlow(c, s, backlog, state.decode);
  }
  const double kv_down = ready * kv / (kv_room * util * (1 - c.scale_down_margin));
  n.pressure = (s.decode_kv_used_ratio - backlog) / kv_room;
  double tpot_up = 0, tpot_down = 0;
  if (s.tpot_p95_s && s.decode_running > 0) {
    const double tpot = *s.tpot_p95_s;
    const double batch = s.decode_running / ready;
    n.pressure = std::max(n.pressure, tpot / c.tpot_target_s);
    // TPOT = floor + slope × batch, fitted on the recent (batch, TPOT)
    // samples when their batches differ enough to tell; otherwise TPOT is
    // taken as proportional to the batch (the conservative reading).
    auto& samples = state.tpot_samples;
    samples.emplace_back(batch, tpot);
    if (samples.size() > kTpotSamples) samples.erase(samples.begin());
    double floor = 0, slope = tpot / batch;
    if (auto fit = fitLine(samples); fit && fit->second > 0 && fit->first >= 0 && fit->first < tpot) {
      floor = fit->first;
      slope = fit->second;
    }
    const double batch_max = std::max(0.0, (c.tpot_target_s - floor) / slope);
    n.capacity = batch_max;
    if (batch_max > 0) {
      tpot_up = s.decode_running / (batch_max * util);
      tpot_down = s.decode_running / (batch_max * util * (1 - c.scale_down_margin));
    } else {
      tpot_up = tpot_down = ready + 1;  // the floor alone misses the target: more replicas are all there is
    }
  }
  n.slo_missed = n.pressure > 1;
  n.up = std::max(kv_up, tpot_up);
  n.down = std::max(kv_down, tpot_down);
  n.why = strCat("KV ", num(100 * s.decode_kv_used_ratio), "% used by running sequences, ",
                 num(100 * s.decode_kv_active_ratio), "% with active sessions, ", num(s.decode_running), " decoding",
                 s.tpot_p95_s ? strCat(", TPOT p95 ", num(*s.tpot_p95_s * 1000), " ms") : std::string(),
                 n.capacity > 0 ? strCat(", ", num(n.capacity), " sequences per replica within the TPOT target")
                                : std::string(),
                 n.full_with_waiting
                     ? (n.flow > 0 ? strCat("; full with ", num(s.decode_waiting), " waiting: ", num(s.requests_per_s),
                                            " requests/s and the waiting drained within an interval of new replicas need ",
                                            num(n.flow))
                                   : strCat("; full with ", num(s.decode_waiting), " waiting: doubled"))
                     : std::string());
  return n;
}

int32_t maxUp(const PlannerConfig& c, int32_t current) { return c.max_step > 0 ? c.max_step : std::max(4, current); }
int32_t maxDown(const PlannerConfig& c, int32_t current) {
  return c.max_step > 0 ? c.max_step : std::max(1, current / 2);
}

// The model's need turned into a replica count for one role: bounded steps,
// cooldowns, the unschedulable and SLO guards, min/max.
RoleDecision decideRole(const PlannerConfig& c, const Signals& s, PlanRole role, const Need& need,
                        PlannerState::RoleState& rs, std::optional<double> state_since) {
  RoleDecision d;
  d.current = d.desired = specOf(s, role);
  d.needed = need.up;
  d.capacity = need.capacity;
  d.pressure = need.pressure;
  d.correction = rs.correction;
  const Bounds& b = boundsOf(c, role);
  const int32_t up = std::clamp(replicasFor(need.up), b.min, b.max);
  const double now = s.at_s;
  // The highest need over the stabilization window.
  auto& recent = rs.recent_down;
  recent.emplace_back(now, need.down);
  std::erase_if(recent, [&](const auto& e) { return e.first < now - c.scale_down_cooldown_s; });
  double peak = 0;
  for (const auto& e : recent) peak = std::max(peak, e.second);
  const int32_t down = std::clamp(replicasFor(peak), b.min, b.max);
  const bool unschedulable = std::any_of(samplesOf(s, role).begin(), samplesOf(s, role).end(),
                                         [](const ReplicaSample& r) { return r.unschedulable; });
  const bool manual = rs.manual_until_s && now < *rs.manual_until_s;
  if (manual && (up > d.current || down < d.current)) {
    d.reason = Reason::kCooldown;
    d.message = strCat("the ", d.current, " replicas set outside the planner stand ", num(*rs.manual_until_s - now),
                       " s more; the model says ", up > d.current ? up : down, " (", need.why, ")");
  } else if (up > d.current) {
    if (unschedulable) {
      d.reason = Reason::kUnschedulable;
      d.message = strCat("needs ", up, " but a ", planRoleName(role),
                         " replica cannot be scheduled: adding more would not help (", need.why, ")");
    } else if (rs.last_up_s && now - *rs.last_up_s < c.scale_up_cooldown_s) {
      d.reason = Reason::kCooldown;
      d.message = strCat("needs ", up, "; scale-up cooldown until ", num(*rs.last_up_s + c.scale_up_cooldown_s - now),
                         " s from now (", need.why, ")");
    } else {
      d.desired = std::min(up, d.current + maxUp(c, d.current));
      d.reason = d.current < b.min ? Reason::kBounds : Reason::kScaleUp;
      d.message = strCat(d.current, " -> ", d.desired, ": ", need.why);
    }
  } else if (down < d.current) {
    // A scale-up is given the scale-down cooldown to show its effect; a
    // scale-down, the (shorter) scale-up cooldown before the next step down.
    std::optional<double> until;
    if (state_since) until = *state_since + c.scale_down_cooldown_s;  // a whole window seen first
    if (rs.last_up_s) until = std::max(until.value_or(0), *rs.last_up_s + c.scale_down_cooldown_s);
    if (rs.last_down_s) until = std::max(until.value_or(0), *rs.last_down_s + c.scale_up_cooldown_s);
    if (d.current > b.max) {
      d.desired = b.max;
      d.reason = Reason::kBounds;
      d.message = strCat(d.current, " -> ", d.desired, ": above the autoscaling maximum");
    } else if (need.slo_missed) {
      d.reason = Reason::kSloMissed;
      d.message = strCat("the model allows ", down, " but the ", planRoleName(role), " SLO is missed now (",
                         num(need.pressure), "x target): no scale-down");
    } else if (until && now < *until) {
      d.reason = Reason::kCooldown;
      d.message = strCat("could shrink to ", down, "; cooldown until ", num(*until - now), " s from now");
    } else {
      d.desired = std::max(down, d.current - maxDown(c, d.current));
      d.reason = Reason::kScaleDown;
      d.message = strCat(d.current, " -> ", d.desired,
                         ", the survivors carry the highest load of the last ", num(c.scale_down_cooldown_s),
                         " s with margin: ", need.why);
    }
  } else {
    d.message = strCat(d.current, " fits: ", need.why);
  }
  return d;
}

// Neither role misses its SLO and both want more than the GPU budget: each
// gets the same share of what it wants (a pressure far below 1 says little
// about which role is short: a TPOT at a fourth of its target against a
// TTFT at a tenth of its target, while prefill runs at 90 % of its compute,
// would take prefill's last spare replica for decode's KV headroom, and a
// prefill backlog then fills decode's KV with reservations, evicts resident
// sessions and brings them back as whole prompts). Prefill's share is
// rounded up, decode gets the rest; a share within a tenth (at least one
// replica) of what prefill has keeps what it has, so noise in the needs
// does not move replicas back and forth. False (nothing changed) when a
// role's count stands (a user's edit) or the minimums alone do not fit.
bool shareBudget(const PlannerConfig& c, const PlannerState& state, double s_at, Decision& d) {
  RoleDecision& p = d.prefill;
  RoleDecision& q = d.decode;
  for (PlanRole r : kPlanRoles) {
    const auto& until = state.role(r).manual_until_s;
    const Reason why = d.role(r).reason;
    if (why == Reason::kManualOverride || why == Reason::kMissingData || (until && s_at < *until)) return false;
  }
  if (c.gpus_per_prefill <= 0 || c.gpus_per_decode <= 0) return false;
  // The most prefill replicas that leave decode its minimum.
  const int64_t most_p = (c.gpu_budget - int64_t{c.decode.min} * c.gpus_per_decode) / c.gpus_per_prefill;
  if (most_p < c.prefill.min) return false;
  const double wanted = static_cast<double>(int64_t{p.desired} * c.gpus_per_prefill + int64_t{q.desired} * c.gpus_per_decode);
  const double share = static_cast<double>(c.gpu_budget) / wanted;
  const int32_t want_p = p.desired, want_d = q.desired;
  int32_t np = std::min(want_p, std::max(c.prefill.min, static_cast<int32_t>(std::ceil(want_p * share))));
  if (std::abs(np - p.current) <= std::max(1, p.current / 10) && p.current <= want_p && p.current >= c.prefill.min) {
    np = p.current;
  }
  np = static_cast<int32_t>(std::min<int64_t>(np, most_p));
  const int64_t left = c.gpu_budget - int64_t{np} * c.gpus_per_prefill;
  const int32_t nd = static_cast<int32_t>(std::min<int64_t>(want_d, left / c.gpus_per_decode));
  if (nd < c.decode.min) return false;
  p.desired = np;
  q.desired = nd;
  for (RoleDecision* rd : {&p, &q}) {
    const int32_t wanted_role = rd == &p ? want_p : want_d;
    if (rd->desired == wanted_role) continue;
    rd->reason = Reason::kBudget;
    rd->message = strCat(rd->current, " -> ", rd->desired, ": the GPU budget of ", c.gpu_budget, " gives each role ",
                         num(100 * share), "% of what it wants (prefill ", want_p, ", decode ", want_d,
                         "); neither misses its SLO");
  }
  return true;
}

// A decision as applied at `at`: each role's step starts its direction's
// cooldown clock, and the replicas written are remembered (for a role left
// as it is too, when `held_too`).
void recordSteps(const Decision& d, double at, bool held_too, PlannerState& state) {
  for (PlanRole r : kPlanRoles) {
    PlannerState::RoleState& rs = state.role(r);
    const RoleDecision& rd = d.role(r);
    if (rd.desired > rd.current) rs.last_up_s = at, rs.last_direction = 1;
    if (rd.desired < rd.current) rs.last_down_s = at, rs.last_direction = -1;
    if (held_too || rd.desired != rd.current) rs.written = rd.desired;
  }
}

// With a GPU budget, the role under less pressure gives way: first what it
// holds beyond its own need, then the other role's growth, then below its
// need (never below min).
void applyBudget(const PlannerConfig& c, const Need& pn, const Need& dn, const PlannerState& state, double s_at,
                 Decision& d) {
  if (c.gpu_budget <= 0) return;
  auto total = [&] {
    return int64_t{d.prefill.desired} * c.gpus_per_prefill + int64_t{d.decode.desired} * c.gpus_per_decode;
  };
  if (total() <= c.gpu_budget) return;
  if (pn.pressure < 1 && dn.pressure < 1 && shareBudget(c, state, s_at, d)) return;
  const PlanRole low = pn.pressure >= dn.pressure ? PlanRole::kDecode : PlanRole::kPrefill;
  double peak = 0;
  for (const auto& e : (low == PlanRole::kPrefill ? state.prefill : state.decode).recent_down) peak = std::max(peak, e.second);
  const int32_t low_window_need = replicasFor(peak);
  const PlanRole high = low == PlanRole::kDecode ? PlanRole::kPrefill : PlanRole::kDecode;
  const int32_t before_p = d.prefill.desired, before_d = d.decode.desired;
  auto cut = [&](PlanRole r, int32_t floor) {
    RoleDecision& rd = d.role(r);
    const auto& until = (r == PlanRole::kPrefill ? state.prefill : state.decode).manual_until_s;
    const bool manual = rd.reason == Reason::kManualOverride || (until && s_at < *until);
    if (manual || gpusOf(c, r) == 0) return;  // a user's count stands
    while (total() > c.gpu_budget && rd.desired > floor) --rd.desired;
  };
  const Need& low_need = low == PlanRole::kPrefill ? pn : dn;
  // First what the role holds beyond what it needed at any time in the
  // stabilization window (so the budget does not bring back flapping);
  // then what it holds for that window's peaks beyond its need now, before
  // the role under pressure is refused its growth (a past peak of one role
  // must not starve the other role's present one).
  const int32_t low_up = replicasFor(low_need.up);
  cut(low, std::max(boundsOf(c, low).min, std::min(d.role(low).desired, std::max(low_up, low_window_need))));
  // (Not for a role whose need is unknown: prefill before any replica has
  // computed a prompt has no capacity to size from.)
  if (low_need.capacity > 0 || low == PlanRole::kDecode) {
    cut(low, std::max(boundsOf(c, low).min, std::min(d.role(low).desired, low_up)));
  }
  cut(high, std::max(boundsOf(c, high).min, std::min(d.role(high).desired, d.role(high).current)));
  cut(low, boundsOf(c, low).min);
  cut(high, boundsOf(c, high).min);
  for (PlanRole r : kPlanRoles) {
    RoleDecision& rd = d.role(r);
    const int32_t before = r == PlanRole::kPrefill ? before_p : before_d;
    if (rd.desired == before) continue;
    rd.reason = Reason::kBudget;
    rd.message = strCat(rd.current, " -> ", rd.desired, ": the GPU budget of ", c.gpu_budget, " holds ", before,
                        " prefill/decode replicas at most this way (pressure prefill ", num(pn.pressure), ", decode ",
                        num(dn.pressure), ")");
  }
  if (total() > c.gpu_budget) {
    for (PlanRole r : kPlanRoles) {
      d.role(r).message += strCat("; the minimums alone exceed the GPU budget of ", c.gpu_budget);
    }
  }
}

}  // namespace

const char* planRoleName(PlanRole role) { return role == PlanRole::kPrefill ? "prefill" : "decode"; }

const char* reasonName(Reason reason) {
  switch (reason) {
    case Reason::kHold: return "Hold";
    case Reason::kScaleUp: return "ScaleUp";
    case Reason::kScaleDown: return "ScaleDown";
    case Reason::kMissingData: return "MissingData";
    case Reason::kCooldown: return "Cooldown";
    case Reason::kUnschedulable: return "Unschedulable";
    case Reason::kSloMissed: return "SloMissed";
    case Reason::kBudget: return "Budget";
    case Reason::kManualOverride: return "ManualOverride";
    case Reason::kBounds: return "Bounds";
  }
  return "Unknown";
}

absl::Status validatePlannerConfig(const PlannerConfig& c) {
  auto bad = [](std::string_view field, std::string_view what) {
    return absl::InvalidArgumentError(strCat("spec.autoscaling.", field, ": ", what));
  };
  if (!(c.ttft_target_s > 0)) return bad("ttftP95TargetSeconds", "must be > 0");
  if (!(c.tpot_target_s > 0)) return bad("tpotP95TargetSeconds", "must be > 0");
  if (!(c.min_free_kv_ratio >= 0 && c.min_free_kv_ratio < 1)) return bad("minFreeKvRatio", "must be in [0, 1)");
  for (PlanRole r : kPlanRoles) {
    const Bounds& b = boundsOf(c, r);
    if (b.min < 0 || b.max < b.min) {
      return bad(strCat(planRoleName(r)), strCat("min ", b.min, " and max ", b.max, ": need 0 <= min <= max"));
    }
  }
  if (c.gpus_per_prefill < 0 || c.gpus_per_decode < 0) return bad("gpuBudget", "GPUs per pod must be >= 0");
  if (c.gpu_budget < 0) return bad("gpuBudget", "must be >= 0");
  if (!(c.scale_up_cooldown_s >= 0)) return bad("scaleUpCooldown", "must be >= 0");
  if (!(c.scale_down_cooldown_s >= 0)) return bad("scaleDownCooldown", "must be >= 0");
  if (c.max_step < 0) return bad("maxStep", "must be >= 0");
  if (!(c.headroom >= 0)) return bad("headroom", "must be >= 0");
  if (!(c.scale_down_margin >= 0 && c.scale_down_margin < 1)) return bad("scaleDownMargin", "must be in [0, 1)");
  if (!(c.startup_s >= 0)) return bad("startupSeconds", "must be >= 0");
  if (!(c.interval_s > 0)) return bad("interval", "must be > 0");
  if (!(c.scale_up_check_s >= 0 && c.scale_up_check_s <= c.interval_s)) {
    return bad("scaleUpCheck", "must be between 0 (no checks between intervals) and the interval");
  }
  if (!(c.warmup_s >= 0)) return bad("warmupSeconds", "must be >= 0");
  if (!(c.max_signal_age_s > 0)) return bad("maxSignalAge", "must be > 0");
  return absl::OkStatus();
}

RoutingKnobs routingKnobs(double prefill_pressure, double decode_pressure, const RoutingKnobs& base) {
  RoutingKnobs k = base;
  // Prefill under more pressure than decode: more of a session's turns are
  // computed on D directly; the reverse keeps D's batch for decoding.
  if (prefill_pressure > 0 && decode_pressure > 0) {
    const double ratio = std::clamp(prefill_pressure / decode_pressure, 0.25, 4.0);
    if (ratio >= 1.5 && prefill_pressure > 0.8) k.direct_max_suffix_tokens *= ratio >= 3 ? 4 : 2;
    if (ratio <= 1 / 1.5 && decode_pressure > 0.8) k.direct_max_suffix_tokens /= ratio <= 1.0 / 3 ? 4 : 2;
  }
  return k;
}

int64_t prefillOverloadTokens(double capacity_tokens_per_s, double ttft_target_s) {
  const double tokens = 0.5 * capacity_tokens_per_s * ttft_target_s;
  if (!(tokens > static_cast<double>(kMinPrefillOverloadTokens))) return kMinPrefillOverloadTokens;
  // Two significant figures: the measured capacity moves a little every
  // interval, and the routers' ConfigMap is written only when a knob changes.
  const double unit = std::pow(10.0, std::floor(std::log10(tokens)) - 1);
  return static_cast<int64_t>(std::min(std::round(tokens / unit) * unit, 1e12));
}

Decision decide(const PlannerConfig& c, const Signals& s, PlannerState& state) {
  Decision d;
  for (PlanRole r : kPlanRoles) {
    RoleDecision& rd = d.role(r);
    rd.current = rd.desired = specOf(s, r);
    rd.correction = state.role(r).correction;
  }
  std::vector<std::string> missing = s.missing;
  if (missing.empty() && s.age_s > c.max_signal_age_s) {
    missing.push_back(strCat("every series (newest sample ", num(s.age_s), " s old)"));
  }
  std::string no_capacity;
  Need pn, dn;
  if (missing.empty()) {
    pn = prefillNeed(c, s, state, no_capacity);
    dn = decodeNeed(c, s, state);
  }
  if (!missing.empty()) {
    std::string list;
    for (const std::string& m : missing) list += strCat(list.empty() ? "" : ", ", m);
    for (PlanRole r : kPlanRoles) {
      d.role(r).reason = Reason::kMissingData;
      d.role(r).message = strCat("no action: missing or stale ", list);
    }
    d.knobs = c.base_knobs;
    return d;
  }
  // Requests wait on a full decode pool while prefill keeps up with its
  // queue: the clients' TTFT is decode's to fix. Prefill's pressure is then
  // what its own queue and compute explain (so its SLO guard does not hold
  // replicas decode needs), and decode's is the clients' TTFT: under a GPU
  // budget prefill gives way, where the TTFT alone would starve decode and
  // never recover.
  if (dn.full_with_waiting && pn.capacity > 0 && !pn.behind && pn.pressure > dn.pressure) {
    dn.pressure = pn.pressure;
    dn.slo_missed = true;
    pn.pressure = pn.own_pressure;
    pn.slo_missed = pn.pressure > 1;
  }
  if (!state.since_s) state.since_s = s.at_s;
  d.prefill = decideRole(c, s, PlanRole::kPrefill, pn, state.prefill, state.since_s);
  d.decode = decideRole(c, s, PlanRole::kDecode, dn, state.decode, state.since_s);
  d.prefill.overloaded = pn.slo_missed || pn.behind;
  d.decode.overloaded = dn.slo_missed || dn.full_with_waiting;
  if (!no_capacity.empty()) {
    d.prefill.desired = d.prefill.current;
    d.prefill.reason = Reason::kMissingData;
    d.prefill.message = strCat("no action: missing ", no_capacity);
  }
  // Someone else set the replicas: theirs stands for one cooldown.
  for (PlanRole r : kPlanRoles) {
    PlannerState::RoleState& rs = state.role(r);
    RoleDecision& rd = d.role(r);
    if (rs.written >= 0 && rd.current != rs.written) {
      // Kept for one cooldown either way (the longer of the two): neither
      // grown nor shrunk before it passes, nor cut for the GPU budget.
      rs.manual_until_s = s.at_s + std::max(c.scale_up_cooldown_s, c.scale_down_cooldown_s);
      rd.message = strCat("spec.", planRoleName(r), ".replicas was changed to ", rd.current,
                          " outside the planner (it wrote ", rs.written, "): kept for one cooldown");
      rd.desired = rd.current;
      rd.reason = Reason::kManualOverride;
      rs.written = rd.current;
    }
  }
  applyBudget(c, pn, dn, state, s.at_s, d);
  recordSteps(d, s.at_s, /*held_too=*/true, state);
  d.knobs = routingKnobs(pn.pressure, dn.pressure, c.base_knobs);
  if (d.decode.desired > d.decode.current) d.knobs.load_floor_weight *= 2;  // fill the new decode replicas first
  if (!c.prefill_overload_from_pool && state.prefill.capacity) {
    d.knobs.prefill_overload_tokens = prefillOverloadTokens(*state.prefill.capacity, c.ttft_target_s);
  }
  return d;
}

Decision checkScaleUp(const PlannerConfig& c, const Signals& s, PlannerState& state) {
  PlannerState scratch = state;  // what decide() learns here is the next interval's to learn
  Decision d = decide(c, s, scratch);
  auto urgent = [](const RoleDecision& rd) { return rd.desired > rd.current && rd.overloaded; };
  const bool grows = urgent(d.prefill) || urgent(d.decode);
  for (PlanRole r : kPlanRoles) {
    RoleDecision& rd = d.role(r);
    const bool makes_room = rd.reason == Reason::kBudget && rd.desired < rd.current;
    if (rd.desired == rd.current || urgent(rd) || (grows && makes_room)) continue;
    rd.message = strCat("would go ", rd.current, " -> ", rd.desired, " (", reasonName(rd.reason),
                        "); between intervals only the growth of an overloaded role is acted on: ", rd.message);
    rd.desired = rd.current;
    rd.reason = Reason::kHold;
  }
  // A shrink held back may leave less room than the full decision counted on.
  if (c.gpu_budget > 0) {
    auto total = [&] {
      return int64_t{d.prefill.desired} * c.gpus_per_prefill + int64_t{d.decode.desired} * c.gpus_per_decode;
    };
    for (PlanRole r : kPlanRoles) {
      RoleDecision& rd = d.role(r);
      const int32_t asked = rd.desired;
      while (total() > c.gpu_budget && rd.desired > rd.current) --rd.desired;
      if (rd.desired == asked) continue;
      rd.message = strCat("would go ", rd.current, " -> ", asked, " (", reasonName(rd.reason), "); the GPU budget of ",
                          c.gpu_budget, " holds ", rd.desired, " until the interval frees room: ", rd.message);
      rd.reason = rd.desired > rd.current ? rd.reason : Reason::kBudget;
    }
  }
  // The roles it holds keep what the intervals wrote: a user's edit since
  // is still seen as one by the next interval.
  recordSteps(d, s.at_s, /*held_too=*/false, state);
  return d;
}

}  // namespace tandem::planner
