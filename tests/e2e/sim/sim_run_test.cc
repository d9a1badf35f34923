// The cluster simulation on small synthetic traces: what each scaling
// policy does with a load it can and cannot carry.

#include <cstdlib>
#include <iostream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "e2e/replay/replay_input.h"
#include "e2e/sim/cluster_sim.h"
#include "e2e/sim/scaling_policies.h"
#include "e2e/sim/sim_cli.h"

namespace tandem::sim {
namespace {

// `rate(t)` requests per second of `prompt` tokens (no shared prefix) and
// `output` tokens, for `seconds`.
replay::Trace steady(double seconds, const std::function<double(double)>& rate, int64_t prompt, int64_t output) {
  replay::Trace t;
  uint64_t id = 0;
  double at = 0;
  while (at < seconds) {
    replay::TraceRequest r{.timestamp_ms = at * 1000, .input_length = prompt, .output_length = output};
    for (int64_t b = 0; b < (prompt + 511) / 512; ++b) r.hash_ids.push_back(id++);
    t.requests.push_back(std::move(r));
    at += 1 / rate(at);
  }
  return t;
}

SimOptions options() {
  SimOptions o;
  o.engine.prefill_tokens_per_s = 10000;
  o.engine.startup_s = 30;
  o.engine.warmup_s = 0;
  o.interval_s = 15;
  return o;
}

SimResult run(const replay::ReplayInput& in, ScalingPolicy& policy, SimOptions o = options()) {
  if (std::getenv("SIM_LOG")) o.log = &std::cerr;
  absl::StatusOr<SimResult> r = runSim(in, o, policy);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SimResult{};
}

// The planner for options()' engines: up to 16 replicas per role, starting in 30 s.
planner::PlannerConfig smallPlanner() {
  planner::PlannerConfig c;
  c.prefill = {1, 16};
  c.decode = {1, 16};
  c.startup_s = 30;
  c.warmup_s = 0;
  return c;
}

TEST(SimRunTest, ALoadThePoolCarriesMeetsItsSlosAndRunsTheSameTwice) {
  const auto in = replay::prepareReplay(steady(300, [](double) { return 2.0; }, 2000, 50));
  auto a = staticPolicy({1, 1});
  auto b = staticPolicy({1, 1});
  const SimResult x = run(in, *a), y = run(in, *b);
  EXPECT_EQ(x.requests, static_cast<int64_t>(in.requests.size()));
  EXPECT_EQ(x.met, x.requests) << "4k tokens/s on a 10k tokens/s prefill replica";
  EXPECT_DOUBLE_EQ(x.slo_attainment, 1.0);
  ASSERT_EQ(x.attainment_by_interval.size(), 20u) << "300 s in 15 s intervals";
  for (double a : x.attainment_by_interval) EXPECT_DOUBLE_EQ(a, 1.0);
  EXPECT_EQ(x.dropped, 0);
  EXPECT_LT(x.p95_ttft_s, 1.0);
  EXPECT_NEAR(x.gpu_hours, 2 * x.duration_s / 3600, 1e-9) << "two replicas for the whole run";
  EXPECT_EQ(x.actions, 0);
  EXPECT_EQ(x.met, y.met);
  EXPECT_DOUBLE_EQ(x.p95_ttft_s, y.p95_ttft_s);
  EXPECT_DOUBLE_EQ(x.p95_tpot_s, y.p95_tpot_s);
}

TEST(SimRunTest, APrefillOverloadMissesTheTtftSloAndMorePrefillReplicasFixIt) {
  // 30k tokens/s of prompts: three replicas' worth.
  const auto in = replay::prepareReplay(steady(300, [](double) { return 15.0; }, 2000, 20));
  auto small = staticPolicy({1, 2});
  auto big = staticPolicy({5, 2});
  const SimResult s = run(in, *small), b = run(in, *big);
  EXPECT_LT(s.slo_attainment, 0.5);
  EXPECT_GT(s.p95_ttft_s, 4);
  EXPECT_GT(b.slo_attainment, 0.99);
  // The sweep finds a prefill-heavy split of 8 GPUs.
  auto best = bestStatic(in, options(), 8);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_GE(best->second.prefill, 4);
  EXPECT_GT(best->first.slo_attainment, 0.99);
  EXPECT_EQ(best->first.policy, "static-best");
}

TEST(SimRunTest, ThePlannerFollowsAStepUpAndDownWithoutLosingARequest) {
  // 1 request/s, then 12/s for 5 minutes, then 1/s again.
  auto rate = [](double t) { return t >= 300 && t < 600 ? 12.0 : 1.0; };
  const auto in = replay::prepareReplay(steady(1200, rate, 2000, 20));
  planner::PlannerConfig c = smallPlanner();
  c.gpu_budget = 32;
  c.scale_down_cooldown_s = 120;
  auto tandem = tandemPolicy(TandemOptions{.config = c, .initial = {1, 1}});
  auto fixed = staticPolicy({1, 1});
  const SimResult t = run(in, *tandem), f = run(in, *fixed);
  EXPECT_GE(t.peak_prefill, 3) << "24k tokens/s needs 3 replicas at 10k";
  EXPECT_GT(t.actions, 1);
  EXPECT_LE(t.reversals, 2) << "up for the step, down after it";
  EXPECT_EQ(t.dropped, 0);
  EXPECT_GT(t.slo_attainment, f.slo_attainment + 0.2) << t.slo_attainment << " vs " << f.slo_attainment;
  EXPECT_GT(t.slo_attainment, 0.7) << "the step is 12x; a replica takes 30 s";
  // Before the step every interval met its SLOs; the step's first intervals
  // did not; well after it they do again.
  ASSERT_GE(t.attainment_by_interval.size(), 60u);
  EXPECT_DOUBLE_EQ(t.attainment_by_interval[5], 1.0);
  EXPECT_LT(t.attainment_by_interval[20], 0.9);
  EXPECT_GT(t.attainment_by_interval[35], 0.95);
  // It gave the replicas back: fewer GPU-hours than holding the peak throughout.
  EXPECT_LT(t.gpu_hours, (t.peak_prefill + t.peak_decode) * t.duration_s / 3600 * 0.8);
}

TEST(SimRunTest, CheckingForGrowthBetweenIntervalsMeetsAStepSooner) {
  // 1 request/s, then 12/s from 302 s (just after an interval's decision;
  // intervals of 30 s, a check every 10 s).
  auto rate = [](double t) { return t >= 302 ? 12.0 : 1.0; };
  const auto in = replay::prepareReplay(steady(600, rate, 2000, 20));
  SimOptions o = options();
  o.interval_s = 30;
  planner::PlannerConfig c = smallPlanner();
  c.interval_s = 30;
  c.scale_up_check_s = 0;
  auto intervals_only = tandemPolicy(TandemOptions{.config = c, .initial = {1, 1}});
  c.scale_up_check_s = 10;
  auto checked = tandemPolicy(TandemOptions{.config = c, .initial = {1, 1}});
  const SimResult a = run(in, *intervals_only, o), b = run(in, *checked, o);
  EXPECT_EQ(a.dropped + b.dropped, 0);
  // The step's requests (from 300 s: intervals 10 on) meet their SLOs sooner.
  auto met_after_step = [](const SimResult& r) {
    double sum = 0;
    for (size_t i = 10; i < 14 && i < r.attainment_by_interval.size(); ++i) sum += r.attainment_by_interval[i];
    return sum;
  };
  EXPECT_GT(met_after_step(b), met_after_step(a) + 0.3) << b.slo_attainment << " vs " << a.slo_attainment;
  EXPECT_GT(b.slo_attainment, a.slo_attainment);
  EXPECT_LE(b.reversals, a.reversals) << "acting sooner does not make it flap";
}

TEST(SimRunTest, TheIntervalBaselineScalesOnThroughput) {
  auto rate = [](double t) { return t >= 300 ? 12.0 : 1.0; };
  const auto in = replay::prepareReplay(steady(900, rate, 2000, 20));
  SimOptions o = options();
  auto interval = intervalPolicy(IntervalOptions{.profile = o.engine, .slo = o.slo, .gpu_budget = 32, .initial = {1, 1}});
  const SimResult r = run(in, *interval, o);
  EXPECT_EQ(r.policy, "interval");
  EXPECT_GE(r.peak_prefill, 3);
  EXPECT_GT(r.actions, 0);
}

}  // namespace
}  // namespace tandem::sim
