// ./tandem bench planner: the planner against the best static split (by
// hindsight sweep) and the throughput-interval baseline, in tandem-sim, on
// the Azure code trace and on generated agentic sessions, with --load-scale
// so the best static split needs most of the GPUs; then a 2x step in load
// (recovery) and a sweep of the replica start-up time (docs/planner.md).
//
// Every row's reference is a baseline run in the same process on the same
// input (the yardstick): the best static split, or the interval planner.
// The engines are tandem-sim's model (EngineModel defaults), not hardware.
//
//   bench_planner --out FILE [--traces DIR] [--gpus 64] [--quick]
//                 [--step-only] [--startup S] [--seed N] [--oracle] [--log]
//
// --step-only runs only the 2x step; --startup S only that start-up time;
// --seed N draws the step's Poisson arrivals with another seed (default 7);
// --oracle adds, per start-up time, the recovery of the best fixed split
// found in hindsight when asked for at the step's instant, at the first
// check between intervals after it and at the first interval's decision
// after it (bounds for any policy; minutes each); --log prints the
// planner's intervals and each interval's attainment around the step.
//
// --gpus 512 is the large configuration: its static sweep alone runs
// for tens of minutes on two cores.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_report.h"
#include "e2e/replay/generator.h"
#include "e2e/replay/replay_input.h"
#include "e2e/sim/cluster_sim.h"
#include "e2e/sim/scaling_policies.h"
#include "e2e/sim/sim_cli.h"
#include "e2e/sim/sim_trace.h"

namespace {

using namespace tandem;
using namespace tandem::sim;

struct Runs {
  SimResult best, interval, tandem;
  // The planner held to a GPU budget at which its GPU-hours are at most the
  // interval planner's: the GPUs that one used on average, or fewer.
  SimResult tandem_at_interval_gpus;
  int interval_mean_gpus = 0, tandem_budget = 0;
  PoolSize best_size;
};

Runs runAll(const replay::ReplayInput& in, const SimOptions& o, int gpus, bool with_best = true,
            std::ostream* tandem_log = nullptr) {
  Runs r;
  if (with_best) {
    auto best = bestStatic(in, o, gpus);
    if (!best.ok()) {
      std::cerr << "bench_planner: " << best.status() << "\n";
      std::exit(1);
    }
    r.best = best->first;
    r.best_size = best->second;
  }
  const PoolSize start = defaultInitialSize(gpus);
  auto interval = intervalPolicy({.profile = o.engine, .slo = o.slo, .gpu_budget = gpus, .initial = start});
  auto tandem = tandemPolicy({.config = simPlannerConfig(o, gpus, /*min_replicas=*/2), .initial = start});
  auto i = runSim(in, o, *interval);
  SimOptions ot = o;
  ot.log = tandem_log;
  auto t = runSim(in, ot, *tandem);
  if (!i.ok() || !t.ok()) {
    std::cerr << "bench_planner: " << (i.ok() ? t.status() : i.status()) << "\n";
    std::exit(1);
  }
  r.interval = *i;
  r.tandem = *t;
  if (!with_best) return r;  // the step rows compare recovery only
  // The planner's budget: the interval planner's mean GPUs, lowered while
  // its GPU-hours are more than the interval planner's (a backlog lengthens
  // a run, and GPU-hours with it), so the comparison is at equal or fewer
  // GPU-hours.
  r.interval_mean_gpus = std::max(
      4, static_cast<int>(std::floor(i->gpu_hours * 3600 / std::max(1.0, i->duration_s))));
  for (int budget = r.interval_mean_gpus;; --budget) {
    auto capped = tandemPolicy({.config = simPlannerConfig(o, budget, 2), .initial = defaultInitialSize(budget)});
    auto c = runSim(in, o, *capped);
    if (!c.ok()) {
      std::cerr << "bench_planner: " << c.status() << "\n";
      std::exit(1);
    }
    r.tandem_at_interval_gpus = *c;
    r.tandem_budget = budget;
    if (c->gpu_hours <= i->gpu_hours || budget <= 4) break;
  }
  return r;
}

void report(std::vector<bench::Result>& out, const std::string& prefix, const Runs& r) {
  std::fprintf(stderr, "%s: static-best %d:%d attainment %.3f GPU-h %.2f | interval %.3f GPU-h %.2f | tandem %.3f GPU-h %.2f reversals %lld/%lld intervals\n",
               prefix.c_str(), r.best_size.prefill, r.best_size.decode, r.best.slo_attainment, r.best.gpu_hours,
               r.interval.slo_attainment, r.interval.gpu_hours, r.tandem.slo_attainment, r.tandem.gpu_hours,
               static_cast<long long>(r.tandem.reversals), static_cast<long long>(r.tandem.intervals));
  out.push_back({.name = prefix + "_tandem_attainment_vs_static_best", .value = r.tandem.slo_attainment, .unit = "share",
                 .reference = r.best.slo_attainment, .reference_name = "static-best attainment"});
  out.push_back({.name = prefix + "_tandem_gpu_hours_vs_static_best", .value = r.tandem.gpu_hours, .unit = "GPU-h",
                 .reference = r.best.gpu_hours, .reference_name = "static-best GPU-hours"});
  out.push_back({.name = prefix + "_tandem_attainment_vs_interval", .value = r.tandem.slo_attainment, .unit = "share",
                 .reference = std::max(1e-3, r.interval.slo_attainment), .reference_name = "interval attainment"});
  out.push_back({.name = prefix + "_tandem_gpu_hours_vs_interval", .value = r.tandem.gpu_hours, .unit = "GPU-h",
                 .reference = r.interval.gpu_hours, .reference_name = "interval GPU-hours"});
  std::fprintf(stderr, "%s: held to %d GPUs (the interval planner's mean: %d): tandem %.3f GPU-h %.2f | interval %.3f GPU-h %.2f\n",
               prefix.c_str(), r.tandem_budget, r.interval_mean_gpus, r.tandem_at_interval_gpus.slo_attainment,
               r.tandem_at_interval_gpus.gpu_hours, r.interval.slo_attainment, r.interval.gpu_hours);
  out.push_back({.name = prefix + "_tandem_attainment_vs_interval_at_its_gpus",
                 .value = r.tandem_at_interval_gpus.slo_attainment,
                 .unit = "share",
                 .reference = std::max(1e-3, r.interval.slo_attainment),
                 .reference_name = "interval attainment (tandem held to at most interval's GPU-hours)"});
  out.push_back({.name = prefix + "_tandem_gpu_hours_vs_interval_at_its_gpus",
                 .value = r.tandem_at_interval_gpus.gpu_hours,
                 .unit = "GPU-h",
                 .reference = r.interval.gpu_hours,
                 .reference_name = "interval GPU-hours"});
  const double per10 = r.tandem.intervals > 0 ? 10.0 * r.tandem.reversals / r.tandem.intervals : 0;
  const double per10_i = r.interval.intervals > 0 ? 10.0 * r.interval.reversals / r.interval.intervals : 0;
  out.push_back({.name = prefix + "_tandem_reversals_per_10_intervals", .value = per10, .unit = "reversals",
                 .reference = std::max(1e-3, per10_i), .reference_name = "interval reversals per 10 intervals"});
}

// Poisson arrivals of `rate(t)` requests/s, prompts and answers of fixed
// size, no shared prefix, for `seconds`.
replay::Trace poisson(double seconds, const std::function<double(double)>& rate, int64_t prompt, int64_t output,
                      uint64_t seed) {
  replay::Trace t;
  uint64_t state = seed * 2654435761u + 1, id = 0;
  auto uniform = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (static_cast<double>(state >> 11) + 0.5) / 9007199254740992.0;
  };
  for (double at = 0; at < seconds;) {
    replay::TraceRequest r{.timestamp_ms = at * 1000, .input_length = prompt, .output_length = output};
    for (int64_t b = 0; b < (prompt + 511) / 512; ++b) r.hash_ids.push_back(id++);
    t.requests.push_back(std::move(r));
    at += -std::log(uniform()) / rate(at);
  }
  return t;
}

// Intervals after `step_interval` until attainment is back at >= 0.95 and
// stays there for 3 intervals; -1 if never.
int recovery(const SimResult& r, size_t step_interval) {
  const auto& a = r.attainment_by_interval;
  for (size_t i = step_interval; i + 2 < a.size(); ++i) {
    if (a[i] >= 0.95 && a[i + 1] >= 0.95 && a[i + 2] >= 0.95) return static_cast<int>(i - step_interval);
  }
  return -1;
}

// Bounds on what any policy could do after a step it cannot foresee: it
// asks for `after` (found by sweep in hindsight) from `act_at` on, `before`
// until then: at the step's instant (no policy reacts sooner), at the
// first check between intervals that sees it (no reactive policy that
// checks that often reacts sooner), or at the first decision that sees it
// (no policy that decides only at intervals reacts sooner). Replicas still
// take the start-up time to come up.
class StepOracle final : public ScalingPolicy {
 public:
  StepOracle(PoolSize before, PoolSize after, double act_at, double check_every)
      : before_(before), after_(after), act_at_(act_at), check_every_(check_every) {}
  std::string name() const override { return "step-oracle"; }
  PoolSize initial() const override { return before_; }
  PoolSize decide(const planner::Signals& s) override { return s.at_s >= act_at_ ? after_ : before_; }
  double checkEvery() const override { return check_every_; }
  std::optional<PoolSize> check(const planner::Signals& s) override {
    return s.at_s >= act_at_ ? std::optional<PoolSize>(after_) : std::nullopt;
  }

 private:
  PoolSize before_, after_;
  double act_at_, check_every_;
};

// The oracle's fastest recovery over the splits of `gpus` after the step
// (fewest GPUs among equals): a coarse grid, then its neighbours.
std::pair<int, PoolSize> oracleRecovery(const replay::ReplayInput& in, const SimOptions& o, int gpus, PoolSize before,
                                        double act_at, size_t step_interval, double check_every = 0) {
  int best = -1;
  PoolSize best_size;
  auto consider = [&](PoolSize after) {
    if (after.prefill < 1 || after.decode < 1 || after.prefill + after.decode > gpus) return;
    StepOracle policy(before, after, act_at, check_every);
    auto r = runSim(in, o, policy);
    if (!r.ok()) {
      std::cerr << "bench_planner: " << r.status() << "\n";
      std::exit(1);
    }
    const int rec = recovery(*r, step_interval);
    if (rec < 0) return;
    if (best < 0 || rec < best ||
        (rec == best && after.prefill + after.decode < best_size.prefill + best_size.decode)) {
      best = rec;
      best_size = after;
    }
  };
  for (int32_t p = before.prefill; p <= gpus; p += 4) {
    for (int32_t d = before.decode; p + d <= gpus; d += 4) consider({p, d});
  }
  if (best >= 0) {
    const PoolSize c = best_size;
    for (int32_t dp = -2; dp <= 2; ++dp) {
      for (int32_t dd = -2; dd <= 2; ++dd) consider({c.prefill + dp, c.decode + dd});
    }
  }
  return {best, best_size};
}

}  // namespace

int main(int argc, char** argv) {
  std::string traces = std::string(TANDEM_SOURCE_DIR) + "/../shared/traces";
  int gpus = 64;
  bool quick = false, step_only = false, oracle = false, log = false;
  uint64_t seed = 7;  // the step's arrivals
  std::vector<double> startups = {10, 30, 60, 120, 300};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--traces" && i + 1 < argc) traces = argv[++i];
    if (a == "--step-only") step_only = true;  // only the 2x step and the start-up sweep
    if (a == "--oracle") oracle = true;  // also the oracles' recovery after the step (minutes per start-up time)
    if (a == "--log") log = true;        // the planner's intervals around the step, on stderr
    if (a == "--startup" && i + 1 < argc) startups = {std::atof(argv[++i])};  // one start-up time for the step
    if (a == "--gpus" && i + 1 < argc) gpus = std::atoi(argv[++i]);
    if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    if (a == "--quick") quick = true;
  }
  if (gpus < 8) {
    std::cerr << "bench_planner: --gpus must be at least 8\n";
    return 2;
  }
  const double scale = gpus / 64.0;
  SimOptions o;
  std::vector<bench::Result> results;

  if (!step_only) {
    // 1. The Azure code trace, scaled so the best static split needs most of the GPUs.
    auto azure = readAzureTrace(traces + "/azure_llm_2023_code.csv");
    if (!azure.ok()) {
      std::cerr << "bench_planner: " << azure.status() << " (--traces DIR: where azure_llm_2023_code.csv is)\n";
      return 1;
    }
    const int azure_k = static_cast<int>(std::lround(12 * scale));
    const auto azure_in = replay::prepareReplay(scaleLoad(*azure, azure_k));
    report(results, "azure_x" + std::to_string(azure_k) + "_" + std::to_string(gpus) + "gpu", runAll(azure_in, o, gpus));

    // 2. Agentic coding sessions (DualPath 32K shape), likewise.
    replay::GeneratorOptions g;
    // 1,200 sessions per 64 GPUs: the smallest static split that meets the
    // SLOs takes about 48 of the 64 (4:44; 4:36 collapses).
    g.num_sessions = static_cast<int>(std::lround(quick ? 200 : 1200 * scale));
    g.active_sessions = g.num_sessions / 2.0;
    auto sessions = replay::generateSessions(g);
    if (!sessions.ok()) {
      std::cerr << "bench_planner: " << sessions.status() << "\n";
      return 1;
    }
    const auto sessions_in = replay::prepareReplay(*sessions);
    report(results, "sessions" + std::to_string(g.num_sessions) + "_" + std::to_string(gpus) + "gpu",
           runAll(sessions_in, o, gpus));
  }

  // 3. A 2x step in load (20 min at r, then 2r at about 70% of the GPUs'
  // prefill capacity), and the replica start-up time swept.
  const double base_rate = 0.35 * gpus * o.engine.prefill_tokens_per_s / 4000 / 2;  // requests/s of 4000-token prompts
  const double step_at = 1200;
  const auto step_in = replay::prepareReplay(
      poisson(2400, [&](double t) { return t < step_at ? base_rate : 2 * base_rate; }, 4000, 100, seed));
  const size_t step_interval = static_cast<size_t>(step_at / o.interval_s);
  for (double startup : quick ? std::vector<double>{120} : startups) {
    SimOptions so = o;
    so.engine.startup_s = startup;
    const Runs r = runAll(step_in, so, gpus, /*with_best=*/false, log ? &std::cerr : nullptr);
    const std::string p = "step2x_startup" + std::to_string(static_cast<int>(startup)) + "s";
    std::fprintf(stderr, "%s: interval %.3f (recovery %d intervals) | tandem %.3f (recovery %d intervals), GPU-h %.2f vs %.2f\n",
                 p.c_str(), r.interval.slo_attainment, recovery(r.interval, step_interval), r.tandem.slo_attainment,
                 recovery(r.tandem, step_interval), r.tandem.gpu_hours, r.interval.gpu_hours);
    results.push_back({.name = p + "_tandem_attainment_vs_interval", .value = r.tandem.slo_attainment, .unit = "share",
                       .reference = std::max(1e-3, r.interval.slo_attainment), .reference_name = "interval attainment"});
    const int rt = recovery(r.tandem, step_interval), ri = recovery(r.interval, step_interval);
    if (log) {
      for (size_t i = step_interval - 2; i < std::min(r.tandem.attainment_by_interval.size(), step_interval + 12); ++i) {
        std::fprintf(stderr, "interval %zu (t=%.0f): tandem attainment %.3f\n", i, i * o.interval_s,
                     r.tandem.attainment_by_interval[i]);
      }
    }
    results.push_back({.name = p + "_tandem_recovery_intervals_vs_interval",
                       .value = rt < 0 ? 999.0 : static_cast<double>(rt),
                       .unit = "intervals",
                       .reference = ri < 0 ? 999.0 : std::max(0.5, static_cast<double>(ri)),
                       .reference_name = "interval recovery (999: never)"});
    if (oracle) {
      // Before the step: the size the planner holds for the base load (21:4 at 64 GPUs).
      const PoolSize before{static_cast<int32_t>(std::lround(21 * scale)), static_cast<int32_t>(std::lround(4 * scale))};
      const auto [ro, size] = oracleRecovery(step_in, so, gpus, before, step_at, step_interval);
      const double check_s = o.interval_s / 3;  // the planner's checks between intervals
      const auto [rc, csize] = oracleRecovery(step_in, so, gpus, before, step_at + check_s, step_interval, check_s);
      const auto [rr, rsize] = oracleRecovery(step_in, so, gpus, before, step_at + o.interval_s, step_interval);
      std::fprintf(stderr,
                   "%s: oracle recovery (the best split in hindsight) %d intervals at %d:%d when asked at the step, "
                   "%d at %d:%d at the first check after it, %d at %d:%d at the first interval's decision after it\n",
                   p.c_str(), ro, size.prefill, size.decode, rc, csize.prefill, csize.decode, rr, rsize.prefill,
                   rsize.decode);
      results.push_back({.name = p + "_tandem_recovery_intervals_vs_reactive_oracle",
                         .value = rt < 0 ? 999.0 : static_cast<double>(rt),
                         .unit = "intervals",
                         .reference = rc < 0 ? 999.0 : std::max(0.5, static_cast<double>(rc)),
                         .reference_name = "oracle asked at the first check after the step (999: never)"});
    }
  }
  return bench::writeReport("planner", results, argc, argv);
}
