// The planner's decision on synthetic series: a toy pool (below) turns the
// replicas the planner asked for into the next interval's signals, with a
// start-up delay, a warm-up during which new replicas compute slowly, a
// prefill queue that grows when the arrivals exceed the capacity, and a
// TPOT that grows with the batch.

#include "operator/planner/planner.h"

#include "src/routing/router_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::planner {
namespace {

using ::testing::HasSubstr;

constexpr double kInterval = 30;

struct ToyPool {
  double prefill_capacity = 10000;  // uncached tokens/s of a warm replica
  double warming_capacity = 2000;   // ... of one still warming
  double startup_s = 60, warmup_s = 60;
  double tpot_floor = 0.010, tpot_per_seq = 0.001;  // TPOT = floor + per_seq × batch
  double kv_share_per_seq = 0.02;                   // of one decode replica's KV
  double mean_prompt = 2000;
  int32_t unschedulable_prefill = 0;  // the last this many prefill replicas never start
  struct Replica {
    double created = 0;
  };
  std::vector<Replica> prefill, decode;
  double queue = 0;

  ToyPool(int32_t p, int32_t d) : prefill(p, Replica{-1000}), decode(d, Replica{-1000}) {}

  void apply(const Decision& d, double now) {
    auto resize = [&](std::vector<Replica>& v, int32_t n) {
      while (static_cast<int32_t>(v.size()) < n) v.push_back({now});
      while (static_cast<int32_t>(v.size()) > n) v.pop_back();  // the newest go first
    };
    resize(prefill, d.prefill.desired);
    resize(decode, d.decode.desired);
  }

  bool ready(const Replica& r, double now, bool unschedulable) const {
    return !unschedulable && now - r.created >= startup_s;
  }

  // The signals at `now` after an interval at `rate` uncached tokens/s with
  // `running` sequences decoding.
  Signals step(double now, double rate, double running) {
    Signals s;
    s.at_s = now;
    s.spec_prefill = static_cast<int32_t>(prefill.size());
    s.spec_decode = static_cast<int32_t>(decode.size());
    double served = 0;
    for (size_t i = 0; i < prefill.size(); ++i) {
      const bool unsched = static_cast<int32_t>(i) >= s.spec_prefill - unschedulable_prefill;
      ReplicaSample r{.name = "p" + std::to_string(i), .ready = ready(prefill[i], now, unsched)};
      r.unschedulable = unsched;
      if (r.ready) {
        r.ready_for_s = now - prefill[i].created - startup_s;
        r.capacity = r.ready_for_s < warmup_s ? warming_capacity : prefill_capacity;
        served += *r.capacity;
      }
      s.prefill.push_back(r);
    }
    queue = std::max(0.0, queue + (rate - served) * kInterval);
    int32_t d_ready = 0;
    for (size_t i = 0; i < decode.size(); ++i) {
      ReplicaSample r{.name = "d" + std::to_string(i), .ready = ready(decode[i], now, false)};
      if (r.ready) r.ready_for_s = now - decode[i].created - startup_s, ++d_ready;
      s.decode.push_back(r);
    }
    s.uncached_prompt_tokens_per_s = rate;
    s.prefill_queue_tokens = queue;
    s.mean_uncached_prompt_tokens = mean_prompt;
    if (rate > 0) {
      const double rho = std::min(0.99, rate / std::max(1.0, served));
      s.ttft_p95_s = 1.5 * (mean_prompt / prefill_capacity) / (1 - rho) + queue / std::max(1.0, served);
    }
    const double batch = running / std::max(1, d_ready);
    s.decode_running = running;
    s.decode_kv_used_ratio = std::min(1.0, batch * kv_share_per_seq);
    if (running > 0) s.tpot_p95_s = tpot_floor + tpot_per_seq * batch;
    return s;
  }
};

PlannerConfig config() {
  PlannerConfig c;
  c.ttft_target_s = 2;
  c.tpot_target_s = 0.05;
  c.prefill = {1, 64};
  c.decode = {1, 64};
  c.startup_s = 60;
  c.warmup_s = 60;
  return c;
}

// Runs `intervals` decisions; the load comes from `rate(t)` and `running(t)`.
struct Trial {
  std::vector<Decision> decisions;
  int reversals(PlanRole role) const {
    int n = 0, last = 0;
    for (const Decision& d : decisions) {
      const int dir = d.role(role).desired > d.role(role).current ? 1 : d.role(role).desired < d.role(role).current ? -1 : 0;
      if (dir != 0 && last != 0 && dir != last) ++n;
      if (dir != 0) last = dir;
    }
    return n;
  }
};

Trial run(ToyPool& pool, const PlannerConfig& c, PlannerState& state, int intervals,
        const std::function<double(double)>& rate, const std::function<double(double)>& running, double t0 = 0) {
  Trial out;
  for (int i = 0; i < intervals; ++i) {
    const double now = t0 + i * kInterval;
    const Decision d = decide(c, pool.step(now, rate(now), running(now)), state);
    if (std::getenv("PLANNER_TRACE")) {
      std::fprintf(stderr, "t=%.0f queue=%.0f P %d->%d %s: %s | D %d->%d %s: %s\n", now, pool.queue, d.prefill.current,
                   d.prefill.desired, reasonName(d.prefill.reason), d.prefill.message.c_str(), d.decode.current,
                   d.decode.desired, reasonName(d.decode.reason), d.decode.message.c_str());
    }
    pool.apply(d, now);
    out.decisions.push_back(d);
  }
  return out;
}

auto constant(double v) {
  return [v](double) { return v; };
}

TEST(PlannerTest, AStepInPrefillLoadIsMetWithTheHeadroomAndThenHeld) {
  ToyPool pool(2, 2);
  PlannerState state;
  const PlannerConfig c = config();
  run(pool, c, state, 10, constant(15000), constant(20));
  EXPECT_EQ(pool.prefill.size(), 2u) << "15k tokens/s at 10k per replica and 20% headroom: 2";
  const Trial r = run(pool, c, state, 30, constant(60000), constant(20), 10 * kInterval);
  // 60k × 1.2 / 10k = 7.2, plus what the queue built during the start-up.
  EXPECT_GE(pool.prefill.size(), 8u);
  EXPECT_LE(pool.prefill.size(), 9u);
  // The backlog the step built before the new replicas were up is drained
  // with more, given back after the cooldown: one reversal, no more.
  EXPECT_LE(r.reversals(PlanRole::kPrefill), 1);
  size_t peak = 0;
  for (const Decision& d : r.decisions) peak = std::max<size_t>(peak, d.prefill.desired);
  EXPECT_LE(peak, 16u);
  EXPECT_EQ(r.decisions.back().prefill.reason, Reason::kHold) << r.decisions.back().prefill.message;
  EXPECT_EQ(pool.decode.size(), 2u) << "decode load did not change";
}

TEST(PlannerTest, ARampIsMetAheadByTheStartUpTime) {
  // Steady at 5k tokens/s for 10 min, then arrivals rise by 200 tokens/s
  // every second: a replica's worth every 50 s.
  auto ramp = [](double t) { return t < 600 ? 5000 : 5000 + 200 * (t - 600); };
  // The queue's area (tokens × intervals waited) and the replica-intervals
  // held over the ramp, on a pool whose replicas take 120 s to start, with
  // the planner told `planned_startup`.
  struct Cost {
    double queue = 0, replicas = 0;
  };
  auto run_ramp = [&](double planned_startup) {
    ToyPool pool(1, 1);
    pool.startup_s = 120;
    PlannerConfig c = config();
    c.startup_s = planned_startup;
    PlannerState state;
    Cost cost;
    for (int i = 0; i < 40; ++i) {
      const double now = i * kInterval;
      const Decision d = decide(c, pool.step(now, ramp(now), 10), state);
      pool.apply(d, now);
      if (now >= 600) cost.queue += pool.queue, cost.replicas += static_cast<double>(pool.prefill.size());
    }
    return cost;
  };
  // Planning for the start-up extrapolates the ramp over it: replicas are
  // asked for before the load that needs them arrives. A planner that
  // assumes instant replicas is late, lets a larger backlog build and then
  // holds far more replicas to drain it: no less waiting, at more cost.
  const Cost planned = run_ramp(120), naive = run_ramp(0);
  EXPECT_LE(planned.queue, naive.queue) << planned.queue << " vs " << naive.queue;
  EXPECT_LT(planned.replicas, 0.9 * naive.replicas) << planned.replicas << " vs " << naive.replicas;
}

TEST(PlannerTest, ASpikeIsAbsorbedAndScaledBackOnlyAfterTheCooldown) {
  ToyPool pool(2, 2);
  PlannerState state;
  PlannerConfig c = config();
  c.scale_down_cooldown_s = 300;
  run(pool, c, state, 10, constant(12000), constant(10));
  ASSERT_EQ(pool.prefill.size(), 2u);
  // A burst of 2 intervals at 4x.
  auto spike = [](double t) { return t < 360 ? 48000.0 : 12000.0; };
  const Trial r = run(pool, c, state, 30, spike, constant(10), 300);
  size_t peak = 0, first_down = 0;
  for (size_t i = 0; i < r.decisions.size(); ++i) {
    peak = std::max<size_t>(peak, r.decisions[i].prefill.desired);
    if (!first_down && r.decisions[i].prefill.reason == Reason::kScaleDown) first_down = i;
  }
  EXPECT_GT(peak, 4u) << "the queue the spike left is drained by more replicas";
  ASSERT_GT(first_down, 0u);
  size_t last_up = 0;
  for (size_t i = 0; i < r.decisions.size(); ++i) {
    if (r.decisions[i].prefill.desired > r.decisions[i].prefill.current) last_up = i;
  }
  EXPECT_GE((first_down - last_up) * kInterval, c.scale_down_cooldown_s);
  EXPECT_EQ(pool.prefill.size(), 2u) << "back to what the load needs";
}

TEST(PlannerTest, ASlowOscillationAroundAReplicaBoundaryDoesNotFlap) {
  // 8.3k ± 10% tokens/s crosses the 1 → 2 replica boundary (8.33k at 20%
  // headroom) every few minutes; the survivors' load with the margin keeps 2.
  ToyPool pool(2, 1);
  PlannerState state;
  PlannerConfig c = config();
  c.scale_down_cooldown_s = 60;
  auto wave = [](double t) { return 8300 * (1 + 0.1 * std::sin(t / 600 * 2 * M_PI)); };
  const Trial r = run(pool, c, state, 120, wave, constant(5));
  EXPECT_EQ(r.reversals(PlanRole::kPrefill), 0);
  EXPECT_EQ(pool.prefill.size(), 2u);
  // And a constant load exactly at a boundary never moves.
  ToyPool flat(3, 1);
  PlannerState flat_state;
  const Trial f = run(flat, c, flat_state, 60, constant(25000), constant(5));
  int actions = 0;
  for (const Decision& d : f.decisions) actions += d.prefill.desired != d.prefill.current;
  EXPECT_LE(actions, 1);
  EXPECT_EQ(f.reversals(PlanRole::kPrefill), 0);
}

TEST(PlannerTest, MissingOrStaleSeriesChangeNothingAndSayWhich) {
  ToyPool pool(2, 2);
  PlannerState state;
  const PlannerConfig c = config();
  Signals s = pool.step(0, 90000, 200);  // would scale both
  s.missing = {"tandem_router_ttft_seconds_bucket"};
  Decision d = decide(c, s, state);
  for (PlanRole r : kPlanRoles) {
    EXPECT_EQ(d.role(r).reason, Reason::kMissingData);
    EXPECT_EQ(d.role(r).desired, 2);
    EXPECT_THAT(d.role(r).message, HasSubstr("tandem_router_ttft_seconds_bucket"));
  }
  s.missing.clear();
  s.age_s = 600;
  d = decide(c, s, state);
  EXPECT_EQ(d.prefill.reason, Reason::kMissingData);
  EXPECT_THAT(d.prefill.message, HasSubstr("600 s old"));
  EXPECT_FALSE(d.acted());
  s.age_s = 0;
  EXPECT_TRUE(decide(c, s, state).acted()) << "fresh data acts again";
}

TEST(PlannerTest, AScaleDownThatWouldOverloadTheSurvivorsIsRefused) {
  PlannerConfig c = config();
  c.scale_down_cooldown_s = 0;
  PlannerState state;
  // 4 prefill replicas at 10k; 26k tokens/s needs 3.12 at 20% headroom → 4
  // stay. With 3, each survivor would run at 87% (> 83%).
  ToyPool pool(4, 1);
  Trial r = run(pool, c, state, 20, constant(26000), constant(5));
  EXPECT_EQ(pool.prefill.size(), 4u);
  for (const Decision& d : r.decisions) EXPECT_NE(d.prefill.reason, Reason::kScaleDown) << d.prefill.message;
  // At 20k, 3 survivors run at 67%, under 83% × (1 − 20%): one goes.
  run(pool, c, state, 5, constant(20000), constant(5), 600);
  EXPECT_EQ(pool.prefill.size(), 3u);
  // While the TTFT SLO is missed nothing shrinks, whatever the model says.
  Signals s = pool.step(900, 1000, 5);
  s.ttft_p95_s = 5;
  const Decision d = decide(c, s, state);
  EXPECT_EQ(d.prefill.reason, Reason::kSloMissed);
  EXPECT_EQ(d.prefill.desired, 3);
}

TEST(PlannerTest, UnschedulableReplicasStopFurtherGrowthAndSaySo) {
  ToyPool pool(2, 1);
  pool.unschedulable_prefill = 1;  // the second prefill replica fits no node
  PlannerState state;
  PlannerConfig c = config();
  c.scale_up_cooldown_s = 0;
  const Trial r = run(pool, c, state, 10, constant(50000), constant(5));
  EXPECT_EQ(pool.prefill.size(), 2u) << "no replica added while one cannot be placed";
  EXPECT_EQ(r.decisions.back().prefill.reason, Reason::kUnschedulable);
  EXPECT_THAT(r.decisions.back().prefill.message, HasSubstr("cannot be scheduled"));
}

TEST(PlannerTest, WarmingReplicasAreNotReadAsLowCapacity) {
  // New replicas compute at a fifth of their speed for their first 5 min.
  auto peak = [](bool exclude_warming) {
    ToyPool pool(2, 1);
    pool.warmup_s = 300;
    PlannerConfig c = config();
    c.warmup_s = exclude_warming ? 300 : 0;
    c.scale_up_cooldown_s = 0;
    c.scale_down_cooldown_s = 300;  // what the step's backlog needed is given back within the run
    PlannerState state;
    run(pool, c, state, 4, constant(15000), constant(5));
    run(pool, c, state, 30, constant(40000), constant(5), 4 * kInterval);
    return pool.prefill.size();
  };
  const size_t planned = peak(true);
  EXPECT_LE(planned, 6u) << "40k × 1.2 / 10k = 4.8: 5, and at most one more for the queue";
  EXPECT_GT(peak(false), planned) << "reading warming replicas as capacity over-scales";
}

TEST(PlannerTest, DecodeFollowsKvAndTpotWithTheSurvivorsLoadOnScaleDown) {
  ToyPool pool(1, 2);
  PlannerState state;
  PlannerConfig c = config();
  c.scale_down_cooldown_s = 0;
  // 80 sequences on 2 replicas: batch 40, TPOT 50 ms at the target; KV 80%.
  run(pool, c, state, 12, constant(1000), constant(80));
  // TPOT 10 + 1 × batch ms within 50/1.2 ms: batch ≤ 31.7 → 3 replicas;
  // KV 2% per sequence within 90%: 45 per replica.
  EXPECT_EQ(pool.decode.size(), 3u);
  run(pool, c, state, 12, constant(1000), constant(20), 12 * kInterval);
  EXPECT_EQ(pool.decode.size(), 1u) << "20 sequences: one replica at TPOT 30 ms";
}

TEST(PlannerTest, AGpuBudgetGivesWayToTheRoleUnderMorePressure) {
  PlannerConfig c = config();
  c.gpu_budget = 8;
  c.gpus_per_prefill = 1;
  c.gpus_per_decode = 2;
  c.scale_up_cooldown_s = 0;
  c.scale_down_cooldown_s = 0;
  ToyPool pool(2, 3);
  PlannerState state;
  // Prefill needs 6 (50k tokens/s); decode is lightly loaded.
  const Trial r = run(pool, c, state, 15, constant(50000), constant(20));
  for (const Decision& d : r.decisions) {
    EXPECT_LE(d.prefill.desired * 1 + d.decode.desired * 2, 8);
  }
  EXPECT_EQ(pool.decode.size(), 1u) << "decode gave its GPUs up";
  EXPECT_EQ(pool.prefill.size(), 6u);
  bool budget_said = false;
  for (const Decision& d : r.decisions) budget_said |= d.prefill.reason == Reason::kBudget;
  EXPECT_TRUE(budget_said);
}

TEST(PlannerTest, UnderABudgetAPastPeakOfOneRoleDoesNotStarveTheOthersPresentOne) {
  PlannerConfig c = config();
  c.gpu_budget = 10;
  c.scale_down_cooldown_s = 600;  // decode's stabilization window holds its peak for 10 min
  ToyPool pool(2, 8);
  PlannerState state;
  // Decode busy (240 sequences: 8 replicas), prefill light (2).
  run(pool, c, state, 12, constant(15000), constant(240));
  ASSERT_EQ(pool.decode.size(), 8u);
  ASSERT_EQ(pool.prefill.size(), 2u);
  // Decode goes quiet and prefill needs 8 (60k × 1.2 / 10k = 7.2): decode
  // gives up what it holds for its past peak rather than prefill waiting
  // out decode's window.
  const Trial r = run(pool, c, state, 4, constant(60000), constant(40), 12 * kInterval);
  EXPECT_GE(pool.prefill.size(), 7u);
  EXPECT_LE(pool.decode.size(), 3u);
  for (const Decision& d : r.decisions) EXPECT_LE(d.prefill.desired + d.decode.desired, 10);
}

TEST(PlannerTest, RequestsWaitingOnDecodeForKvAreCountedAsPrefillBacklog) {
  // A decode pool filled by a prefill backlog admits no more: the rest of
  // that backlog waits on D and is not in prefill's queue, but it is
  // prefill's work all the same.
  auto prefill_after = [](double waiting, double queued) {
    ToyPool pool(4, 4);
    PlannerState state;
    const PlannerConfig c = config();
    run(pool, c, state, 4, constant(30000), constant(20));
    Signals s = pool.step(4 * kInterval, 30000, 20);
    s.decode_waiting = waiting;
    s.prefill_queue_tokens = queued;
    return decide(c, s, state).prefill.desired;
  };
  EXPECT_EQ(prefill_after(0, 10000), 4) << "30k x 1.2 / 10k, and a small queue";
  // 600 requests of 2,000 tokens: 1.2M tokens drained within the start-up
  // and one interval (90 s) on top of the arrivals (decode's flow is not
  // measured here): (30k + 1.21M / 90) / (10k / 1.2) = 5.2.
  EXPECT_EQ(prefill_after(600, 10000), 6);
  // Prefill idle: the requests wait for decode's own KV, not for prefill.
  EXPECT_EQ(prefill_after(600, 0), 4);
}

TEST(PlannerTest, DecodeKvHeldForAPrefillBacklogAtItsPeakDoesNotGrowDecode) {
  // D reserves a request's KV before its prompt is computed: at the peak of
  // a burst, decode's KV is full of prompts still queued for prefill. The
  // KV ratio and the queue are both read at their peaks, so the part held
  // for the backlog is discounted even when the queue has drained since.
  auto decode_after = [](double queue_peak) {
    ToyPool pool(4, 4);
    PlannerState state;
    const PlannerConfig c = config();
    run(pool, c, state, 4, constant(30000), constant(20));
    Signals s = pool.step(4 * kInterval, 30000, 20);
    s.decode_kv_used_ratio = 0.95;
    s.decode_kv_total_blocks = 4 * 1000;
    s.kv_block_tokens = 512;
    s.prefill_queue_tokens = 0;
    s.prefill_queue_peak_tokens = queue_peak;
    return decide(c, s, state).decode.desired;
  };
  EXPECT_GT(decode_after(0), 4) << "95% of decode's KV held by decoding sequences: more decode";
  // 3M tokens queued at the peak, far beyond the 80k prefill computes within
  // the TTFT target (4 replicas x 10k tokens/s x 2 s): the KV held for them
  // (5,700 blocks' worth) is discounted.
  EXPECT_EQ(decode_after(3.0e6), 4);
}

TEST(PlannerTest, AManualEditIsKeptForOneCooldownAndExplained) {
  ToyPool pool(2, 2);
  PlannerState state;
  PlannerConfig c = config();
  c.scale_down_cooldown_s = 300;
  run(pool, c, state, 4, constant(15000), constant(10));
  pool.prefill.resize(6, ToyPool::Replica{-1000});  // a user scaled prefill to 6
  Decision d = decide(c, pool.step(4 * kInterval, 15000, 10), state);
  EXPECT_EQ(d.prefill.reason, Reason::kManualOverride);
  EXPECT_THAT(d.prefill.message, HasSubstr("changed to 6 outside the planner (it wrote 2)"));
  pool.apply(d, 4 * kInterval);
  const Trial r = run(pool, c, state, 15, constant(15000), constant(10), 5 * kInterval);
  int first_down = -1;
  for (size_t i = 0; i < r.decisions.size() && first_down < 0; ++i) {
    if (r.decisions[i].prefill.reason == Reason::kScaleDown) first_down = static_cast<int>(i);
  }
  ASSERT_GE(first_down, 0);
  EXPECT_GE((first_down + 1) * kInterval, c.scale_down_cooldown_s);
}

TEST(PlannerTest, BoundsAreHonoured) {
  PlannerConfig c = config();
  c.prefill = {2, 3};
  c.scale_up_cooldown_s = 0;
  ToyPool pool(1, 1);
  PlannerState state;
  run(pool, c, state, 10, constant(90000), constant(5));
  EXPECT_EQ(pool.prefill.size(), 3u);
  // The backlog 90k tokens/s left on 30k of capacity is drained first
  // (no scale-down while the TTFT target is missed), then one cooldown.
  run(pool, c, state, 45, constant(0), constant(5), 300);
  EXPECT_EQ(pool.prefill.size(), 2u);
}

TEST(PlannerTest, RoutingKnobsShiftTurnsTowardTheRoleWithRoom) {
  const RoutingKnobs even = routingKnobs(0.5, 0.5);
  EXPECT_GT(routingKnobs(2.0, 0.5).direct_max_suffix_tokens, even.direct_max_suffix_tokens);
  EXPECT_LT(routingKnobs(0.3, 1.2).direct_max_suffix_tokens, even.direct_max_suffix_tokens);
}

TEST(PlannerTest, ATtftTargetNoPromptCanMeetDoesNotPinPrefillAtItsMaximum) {
  PlannerConfig c = config();
  c.ttft_target_s = 0.15;  // a 2000-token prompt alone takes 0.2 s at 10k tokens/s
  c.scale_up_cooldown_s = 0;
  ToyPool pool(2, 1);
  PlannerState state;
  const Trial r = run(pool, c, state, 20, constant(15000), constant(5));
  EXPECT_LE(pool.prefill.size(), 3u) << "sized on utilisation: 15k × 1.2 / 10k";
  EXPECT_THAT(r.decisions.back().prefill.message, HasSubstr("sized on utilisation"));
  // Reachable, but only with far more replicas than utilisation needs (the
  // toy's observed TTFT is 1.5x the model's): at most 4x as many.
  c.ttft_target_s = 0.3;
  ToyPool p2(2, 1);
  PlannerState s2;
  run(p2, c, s2, 20, constant(15000), constant(5));
  EXPECT_LE(p2.prefill.size(), 8u);
  EXPECT_GT(p2.prefill.size(), 2u) << "the feedback still asks for more than utilisation";
}

TEST(PlannerTest, AManualScaleDownIsKeptForACooldownToo) {
  for (const double up_cooldown : {120.0, 0.0}) {  // 0: the default, no scale-up cooldown
    ToyPool pool(3, 2);
    PlannerState state;
    PlannerConfig c = config();
    c.scale_up_cooldown_s = up_cooldown;
    run(pool, c, state, 4, constant(25000), constant(10));
    ASSERT_GE(pool.prefill.size(), 3u);
    pool.prefill.resize(1);  // a user scaled prefill down to 1 under a load that needs 3
    Decision d = decide(c, pool.step(4 * kInterval, 25000, 10), state);
    EXPECT_EQ(d.prefill.reason, Reason::kManualOverride);
    pool.apply(d, 4 * kInterval);
    d = decide(c, pool.step(5 * kInterval, 25000, 10), state);
    EXPECT_EQ(d.prefill.desired, 1) << "not grown back within the cooldown (" << up_cooldown << " s)";
    EXPECT_EQ(d.prefill.reason, Reason::kCooldown);
    EXPECT_THAT(d.prefill.message, HasSubstr("set outside the planner stand"));
    // After the longer cooldown (the stabilization window) the planner sizes it again.
    pool.apply(d, 5 * kInterval);
    run(pool, c, state, 25, constant(25000), constant(10), 6 * kInterval);
    EXPECT_GE(pool.prefill.size(), 3u);
  }
}

TEST(PlannerTest, KnobsScaleThePoolsOwnValuesAndDefaultToTheRoutersOwn) {
  const routing::RouterConfig router;
  EXPECT_EQ(RoutingKnobs{}.direct_max_suffix_tokens, router.direct_max_suffix_tokens);
  EXPECT_DOUBLE_EQ(RoutingKnobs{}.load_floor_weight, router.load_floor_weight);
  const RoutingKnobs base{.direct_max_suffix_tokens = 1000, .load_floor_weight = 0.5};
  EXPECT_EQ(routingKnobs(0.5, 0.5, base).direct_max_suffix_tokens, 1000) << "even pressure: the pool's own";
  EXPECT_EQ(routingKnobs(2.0, 0.5, base).direct_max_suffix_tokens, 4000);
}

// One interval's signals of a pool of warm replicas (Ready for 10 minutes),
// each prefill replica measured at `capacity` tokens/s; the load is the
// caller's.
Signals warmPool(int32_t prefill, int32_t decode, double capacity) {
  Signals s;
  s.at_s = 3000;
  s.spec_prefill = prefill;
  s.spec_decode = decode;
  for (int32_t i = 0; i < prefill; ++i) {
    s.prefill.push_back({.name = "p" + std::to_string(i), .ready = true, .ready_for_s = 600, .capacity = capacity});
  }
  for (int32_t i = 0; i < decode; ++i) {
    s.decode.push_back({.name = "d" + std::to_string(i), .ready = true, .ready_for_s = 600});
  }
  return s;
}

TEST(PlannerTest, UnderABudgetAFullDecodePoolThatPrefillKeepsUpWithGetsTheGpus) {
  // 15 warm prefill replicas compute 150k tokens/s for 60k arriving, their
  // queue small; 5 decode replicas are full with 200 requests waiting for
  // KV. The clients' TTFT (20 s for a 2 s target) is decode's doing: read
  // as prefill's pressure, prefill would keep every replica (SLO missed: no
  // scale-down) and the budget would refuse decode for good.
  PlannerConfig c = config();
  c.gpu_budget = 20;
  c.decode = {1, 64};
  Signals s = warmPool(15, 5, 10000);
  s.uncached_prompt_tokens_per_s = 60000;
  s.prefill_queue_tokens = s.prefill_queue_peak_tokens = 8000;
  s.mean_uncached_prompt_tokens = 2000;
  s.ttft_p95_s = 20;
  s.tpot_p95_s = 0.03;
  s.decode_running = 100;
  s.decode_waiting = 200;
  s.decode_kv_used_ratio = s.decode_kv_active_ratio = 0.99;
  s.decode_kv_total_blocks = 5 * 512;
  s.kv_block_tokens = 512;
  PlannerState state;
  const Decision d = decide(c, s, state);
  EXPECT_GT(d.decode.desired, 5) << d.decode.message;
  EXPECT_LT(d.prefill.desired, 15) << d.prefill.message;
  EXPECT_LE(d.prefill.desired + d.decode.desired, 20);
  EXPECT_GT(d.decode.pressure, d.prefill.pressure) << "the TTFT is decode's pressure now";

  // Prefill whose capacity nobody has measured yet (no replica has computed
  // a prompt since the operator started) is not taken for keeping up: it
  // is left as it is, not cut to its minimum for decode.
  Signals unmeasured = s;
  for (ReplicaSample& r : unmeasured.prefill) r.capacity.reset();
  PlannerState fresh;
  const Decision u = decide(c, unmeasured, fresh);
  EXPECT_EQ(u.prefill.desired, 15) << u.prefill.message;
  EXPECT_EQ(u.prefill.reason, Reason::kMissingData) << u.prefill.message;

  // Prefill that is behind (arrivals beyond what its replicas compute)
  // keeps the TTFT as its own pressure: the waiting requests are its backlog.
  s.uncached_prompt_tokens_per_s = 200000;
  PlannerState behind_state;
  const Decision b = decide(c, s, behind_state);
  EXPECT_GT(b.prefill.pressure, b.decode.pressure) << b.prefill.message;
  EXPECT_GE(b.prefill.desired, 15);
}

TEST(PlannerTest, UnderABudgetNeitherRoleMissingItsSloGetsTheSameShareOfWhatItWants) {
  // Prefill (4 replicas of 10k tokens/s for 60k arriving) wants 8; decode
  // (60 replicas, its working set at 95 % of the KV) wants more for its
  // headroom. Neither misses its SLO (TTFT 0.7 s of 4, TPOT 14 ms of 50):
  // by pressure alone decode (0.28) would keep all it has and take
  // prefill's growth (0.18), leaving prefill at 150 % of its compute.
  PlannerConfig c = config();
  c.ttft_target_s = 4;
  c.gpu_budget = 64;
  c.prefill = {2, 64};
  c.decode = {2, 128};
  Signals s = warmPool(4, 60, 10000);
  s.uncached_prompt_tokens_per_s = 60000;
  s.prefill_queue_tokens = s.prefill_queue_peak_tokens = 4000;
  s.mean_uncached_prompt_tokens = 2000;
  s.ttft_p95_s = 0.7;
  s.tpot_p95_s = 0.014;
  s.decode_running = 120;
  s.decode_kv_used_ratio = 0.2;
  s.decode_kv_active_ratio = 0.95;
  PlannerState state;
  const Decision d = decide(c, s, state);
  // Prefill wants 8, decode 76 (its working set with headroom): 64 of 84,
  // prefill's share rounded up (7), decode the rest (57).
  EXPECT_EQ(d.prefill.desired, 7) << d.prefill.message;
  EXPECT_EQ(d.decode.desired, 57) << d.decode.message;
  EXPECT_EQ(d.decode.reason, Reason::kBudget);
  EXPECT_THAT(d.decode.message, HasSubstr("neither misses its SLO"));

  // A share within one replica of what prefill has keeps it (no back and
  // forth on noise): with 8 prefill replicas, the share of 7 leaves 8.
  // The same load on a pool of other sizes, an interval later.
  auto with = [&](int32_t prefill, int32_t decode) {
    const Signals sized = warmPool(prefill, decode, 10000);
    Signals next = s;
    next.at_s += kInterval;
    next.spec_prefill = sized.spec_prefill;
    next.spec_decode = sized.spec_decode;
    next.prefill = sized.prefill;
    next.decode = sized.decode;
    return next;
  };
  PlannerState kept_state;
  const Decision kept = decide(c, with(8, 56), kept_state);
  EXPECT_EQ(kept.prefill.desired, 8) << kept.prefill.message;
  EXPECT_LE(kept.prefill.desired + kept.decode.desired, 64);

  // ... but never below prefill's minimum: with a minimum of 8 and 7
  // replicas, prefill gets its 8.
  PlannerConfig floor = c;
  floor.prefill.min = 8;
  PlannerState floor_state;
  const Decision raised = decide(floor, with(7, 57), floor_state);
  EXPECT_GE(raised.prefill.desired, 8) << raised.prefill.message;
  EXPECT_LE(raised.prefill.desired + raised.decode.desired, 64);

  // Decode pods of 2 GPUs: the shares still fit the budget.
  PlannerConfig wide = c;
  wide.gpus_per_decode = 2;
  wide.decode.min = 0;
  PlannerState wide_state;
  const Decision w = decide(wide, with(8, 28), wide_state);
  EXPECT_LE(w.prefill.desired + 2 * w.decode.desired, 64) << w.prefill.message << " | " << w.decode.message;
}

TEST(PlannerTest, TheAdmissionWatermarkIsTheQueueAPrefillReplicaClearsInHalfTheTtftTarget) {
  EXPECT_EQ(RoutingKnobs{}.prefill_overload_tokens, routing::RouterConfig{}.prefill_overload_tokens);
  EXPECT_EQ(prefillOverloadTokens(16000, 4), 32000);
  EXPECT_EQ(prefillOverloadTokens(16100, 4), 32000) << "two significant figures";
  EXPECT_EQ(prefillOverloadTokens(17400, 4), 35000);
  EXPECT_EQ(prefillOverloadTokens(100, 1), kMinPrefillOverloadTokens) << "one ordinary prompt never marks a replica";
  EXPECT_EQ(prefillOverloadTokens(0, 4), kMinPrefillOverloadTokens);
  EXPECT_EQ(prefillOverloadTokens(std::numeric_limits<double>::quiet_NaN(), 4), kMinPrefillOverloadTokens);

  // In a run: the routers' default until a warm replica has computed a
  // prompt, then the measured capacity (10,000 tokens/s) × half of 2 s.
  const PlannerConfig c = config();
  {
    ToyPool pool(2, 2);
    for (ToyPool::Replica& r : pool.prefill) r.created = 0;  // still starting: nothing measured
    PlannerState state;
    const Trial idle = run(pool, c, state, 1, constant(0), constant(5));
    EXPECT_EQ(idle.decisions.back().knobs.prefill_overload_tokens, RoutingKnobs{}.prefill_overload_tokens)
        << "nothing measured yet";
    const Trial busy = run(pool, c, state, 3, constant(8000), constant(5), 10 * kInterval);
    EXPECT_EQ(busy.decisions.back().knobs.prefill_overload_tokens, 10000) << "10,000 tokens/s × 2 s / 2";
  }
  // A pool that sets its own watermark keeps it.
  PlannerConfig fixed = c;
  fixed.base_knobs.prefill_overload_tokens = 7777;
  fixed.prefill_overload_from_pool = true;
  ToyPool pool(2, 2);
  PlannerState state;
  const Trial t = run(pool, fixed, state, 3, constant(8000), constant(5));
  EXPECT_EQ(t.decisions.back().knobs.prefill_overload_tokens, 7777);
}

// A warm pool at a steady 30k tokens/s on 4 prefill replicas (4 needed),
// decode with room: the signals of one read.
Signals steadyPool(double at_s, int32_t prefill, int32_t decode, double rate) {
  Signals s = warmPool(prefill, decode, 10000);
  s.at_s = at_s;
  s.uncached_prompt_tokens_per_s = rate;
  s.mean_uncached_prompt_tokens = 2000;
  s.ttft_p95_s = 0.5;
  s.tpot_p95_s = 0.02;
  s.decode_running = 10 * decode;
  s.decode_kv_used_ratio = s.decode_kv_active_ratio = 0.3;
  return s;
}

TEST(PlannerTest, AScaleUpCheckBetweenIntervalsGrowsAtOnceAndLeavesTheRestToTheIntervals) {
  const PlannerConfig c = config();
  PlannerState state;
  const Decision first = decide(c, steadyPool(3000, 4, 4, 30000), state);
  ASSERT_FALSE(first.acted()) << first.prefill.message;
  const PlannerState after_interval = state;

  // Nothing changed: a check acts on nothing and learns nothing.
  Decision d = checkScaleUp(c, steadyPool(3010, 4, 4, 30000), state);
  EXPECT_FALSE(d.acted());
  EXPECT_EQ(state.arrivals, after_interval.arrivals) << "a check does not add to the trend";
  EXPECT_EQ(state.prefill.recent_down, after_interval.prefill.recent_down);
  EXPECT_FALSE(state.prefill.last_up_s);

  // The load doubles ten seconds into the interval: the check grows prefill
  // as the interval's decision would, 20 s before it.
  Signals step = steadyPool(3020, 4, 4, 60000);
  step.prefill_queue_tokens = step.prefill_queue_peak_tokens = 40000;
  step.ttft_p95_s = 3;
  PlannerState copy = state;
  const Decision full = decide(c, step, copy);
  d = checkScaleUp(c, step, state);
  ASSERT_TRUE(d.acted());
  EXPECT_EQ(d.prefill.reason, Reason::kScaleUp) << d.prefill.message;
  EXPECT_EQ(d.prefill.desired, full.prefill.desired) << "the same sizing as the interval's";
  EXPECT_GE(d.prefill.desired, 8) << "60k tokens/s at 10k per replica with 20% headroom";
  EXPECT_EQ(d.decode.desired, 4);
  // What it remembers: the growth (cooldown clock, replicas written), not
  // the interval's learning (trend, capacity, correction, stabilization window).
  EXPECT_EQ(state.prefill.last_up_s, 3020);
  EXPECT_EQ(state.prefill.written, d.prefill.desired);
  EXPECT_EQ(state.prefill.last_direction, 1);
  EXPECT_EQ(state.arrivals, after_interval.arrivals);
  EXPECT_EQ(state.prefill.capacity, after_interval.prefill.capacity);
  EXPECT_EQ(state.prefill.correction, after_interval.prefill.correction);
  EXPECT_EQ(state.prefill.recent_down, after_interval.prefill.recent_down);

  // The next interval finds the spec the check wrote: no manual edit seen,
  // and the replicas still starting count as capacity on the way.
  Signals next = steadyPool(3030, d.prefill.desired, 4, 60000);
  for (int32_t i = 4; i < d.prefill.desired; ++i) {
    next.prefill[i].ready = false;
    next.prefill[i].ready_for_s = 0;
    next.prefill[i].capacity.reset();
  }
  const Decision then = decide(c, next, state);
  EXPECT_NE(then.prefill.reason, Reason::kManualOverride) << then.prefill.message;
  EXPECT_EQ(then.prefill.desired, d.prefill.desired) << then.prefill.message;
}

TEST(PlannerTest, AScaleUpCheckNeverShrinksNorGrowsARoleThatKeepsUp) {
  PlannerConfig c = config();
  c.scale_down_cooldown_s = 60;
  PlannerState state;
  decide(c, steadyPool(0, 8, 4, 60000), state);
  decide(c, steadyPool(30, 8, 4, 60000), state);
  // The load has fallen for longer than the cooldown: an interval would shrink prefill.
  const Signals low = steadyPool(100, 8, 4, 10000);
  PlannerState copy = state;
  ASSERT_EQ(decide(c, low, copy).prefill.reason, Reason::kScaleDown);
  const Decision d = checkScaleUp(c, low, state);
  EXPECT_FALSE(d.acted());
  EXPECT_EQ(d.prefill.reason, Reason::kHold);
  EXPECT_THAT(d.prefill.message, HasSubstr("between intervals only the growth of an overloaded role is acted on"));
  EXPECT_FALSE(state.prefill.last_down_s);

  // More arrivals that the Ready replicas still compute, within the TTFT
  // target: the interval grows for the headroom, a check leaves it to it.
  PlannerState fresh;
  decide(c, steadyPool(3000, 4, 4, 30000), fresh);
  const Signals more = steadyPool(3010, 4, 4, 38000);
  copy = fresh;
  ASSERT_EQ(decide(c, more, copy).prefill.reason, Reason::kScaleUp);
  const Decision held = checkScaleUp(c, more, fresh);
  EXPECT_FALSE(held.acted()) << held.prefill.message;
  EXPECT_FALSE(held.prefill.overloaded);
  EXPECT_THAT(held.prefill.message, HasSubstr("ScaleUp"));
}

// A steady pool (steadyPool) whose decode KV and request rate are known:
// 15 requests/s hold 30% of 4 x 1,000 blocks, 80 block-seconds each.
Signals measuredPool(double at_s) {
  Signals s = steadyPool(at_s, 4, 4, 30000);
  s.requests_per_s = 15;
  s.decode_kv_total_blocks = 4000;
  s.kv_block_tokens = 512;
  return s;
}

// The load doubles: decode full with `waiting` requests waiting for KV,
// prefill's queue growing, TPOT `tpot_s`.
Signals doubledOnAFullDecodePool(double at_s, double waiting, double tpot_s) {
  Signals s = measuredPool(at_s);
  s.requests_per_s = 30;
  s.uncached_prompt_tokens_per_s = 60000;
  s.prefill_queue_tokens = s.prefill_queue_peak_tokens = 40000;
  s.decode_kv_used_ratio = s.decode_kv_active_ratio = 0.95;
  s.decode_waiting = waiting;
  s.tpot_p95_s = tpot_s;
  s.ttft_p95_s = 6;
  return s;
}

TEST(PlannerTest, AFullDecodePoolIsSizedAsAFlowWithPrefillForTheSameBacklog) {
  PlannerConfig c = config();
  c.max_step = 20;  // the sizing, not the step's bound
  PlannerState state;
  decide(c, measuredPool(3000), state);
  decide(c, measuredPool(3030), state);
  ASSERT_TRUE(state.decode.kv_block_seconds);
  EXPECT_NEAR(*state.decode.kv_block_seconds, 80, 1e-9) << "0.3 x 4,000 blocks / 15 requests/s";

  // TPOT doubled (0.02 -> 0.04 s): a request holds its KV twice as long, 160
  // block-seconds. The Ready pool admits 3,600 / 160 = 22.5 requests/s of
  // the 30 arriving: 50 waiting now, 50 + 7.5 x 60 s = 500 when replicas
  // added now are up; drained within an interval, 30 + 500 / 30 requests/s
  // x 160 block-seconds / (1,000 blocks x 0.9 x 1 / 1.2) = 9.96 replicas.
  PlannerState copy = state;
  const Decision d = decide(c, doubledOnAFullDecodePool(3060, 50, 0.04), copy);
  EXPECT_EQ(d.decode.desired, 10) << d.decode.message;
  EXPECT_THAT(d.decode.message, HasSubstr("30 requests/s and the waiting drained within an interval"));
  // Prefill is sized for the same 500 requests (of 2,000 tokens) within an
  // interval: (60,000 + 40,000 / 90 + 1,000,000 / 30) / (10,000 / 1.2) = 11.2.
  EXPECT_EQ(d.prefill.desired, 12) << d.prefill.message;
  EXPECT_THAT(d.prefill.message, HasSubstr("waiting on decode when new replicas are up"));
  // The default step bounds it: up to doubling.
  copy = state;
  EXPECT_EQ(decide(config(), doubledOnAFullDecodePool(3060, 50, 0.04), copy).decode.desired, 8);

  // The same TPOT as measured: the Ready pool admits 45 requests/s, more
  // than arrive, and the flow (30 + 50 / 30 requests/s x 80 / 750 = 3.4
  // replicas) is less than it has: the measurement no longer holds for a
  // pool that is full with requests waiting, and decode doubles. Prefill
  // still counts the 50 waiting (none added: decode admits the arrivals)
  // within an interval: (60,000 + 40,000 / 90 + 100,000 / 30) / 8,333 = 7.7.
  copy = state;
  const Decision stale = decide(c, doubledOnAFullDecodePool(3060, 50, 0.02), copy);
  EXPECT_EQ(stale.decode.desired, 8) << stale.decode.message;
  EXPECT_THAT(stale.decode.message, HasSubstr("doubled"));
  EXPECT_EQ(stale.prefill.desired, 8) << stale.prefill.message;
  EXPECT_THAT(stale.prefill.message, HasSubstr("1e+05 waiting on decode when new replicas are up"));

  // Nothing measured yet (no interval where decode kept up): it doubles,
  // and prefill counts the requests waiting now (50 x 2,000 tokens) with
  // its queue: (60,000 + 140,000 / 90) / (10,000 / 1.2) = 7.4.
  PlannerState blank;
  const Decision unmeasured = decide(c, doubledOnAFullDecodePool(3060, 50, 0.04), blank);
  EXPECT_EQ(unmeasured.decode.desired, 8) << unmeasured.decode.message;
  EXPECT_THAT(unmeasured.decode.message, HasSubstr("doubled"));
  EXPECT_EQ(unmeasured.prefill.desired, 8) << unmeasured.prefill.message;
  EXPECT_THAT(unmeasured.prefill.message, HasSubstr("1e+05 waiting on decode)"));

  // A check between intervals acts on the flow but learns nothing.
  copy = state;
  const Decision checked = checkScaleUp(c, doubledOnAFullDecodePool(3060, 50, 0.04), copy);
  EXPECT_EQ(checked.decode.desired, 10) << checked.decode.message;
  EXPECT_EQ(copy.decode.kv_block_seconds, state.decode.kv_block_seconds);
  EXPECT_EQ(copy.decode.kv_tpot_s, state.decode.kv_tpot_s);
}

TEST(PlannerTest, DecodesBlockSecondsAreLearnedOnlyFromASettledPoolWithTraffic) {
  const PlannerConfig c = config();
  PlannerState state;
  decide(c, measuredPool(3000), state);
  ASSERT_TRUE(state.decode.kv_block_seconds);
  const double learned = *state.decode.kv_block_seconds;  // 80
  auto after = [&](Signals s) {
    PlannerState copy = state;
    decide(c, s, copy);
    return *copy.decode.kv_block_seconds;
  };
  // A trickle of requests while long sequences still hold KV: 0.3 x 4,000
  // blocks / 0.02 requests/s would read 60,000 block-seconds.
  Signals trickle = measuredPool(3030);
  trickle.requests_per_s = 0.02;
  EXPECT_EQ(after(trickle), learned) << "fewer than 20 requests in the interval";
  // A decode replica still warming: the KV ratio and the pool's blocks may
  // describe different replicas.
  Signals warming = measuredPool(3030);
  warming.decode[3].ready_for_s = 10;
  EXPECT_EQ(after(warming), learned);
  Signals starting = measuredPool(3030);
  starting.decode.push_back({.name = "d4", .ready = false});
  starting.spec_decode = 5;
  EXPECT_EQ(after(starting), learned);
  // No TPOT to stretch it by later.
  Signals no_tpot = measuredPool(3030);
  no_tpot.tpot_p95_s.reset();
  EXPECT_EQ(after(no_tpot), learned);
  // Requests waiting, or KV held for a prefill backlog: decode did not admit every request.
  Signals waiting = measuredPool(3030);
  waiting.decode_waiting = 3;
  EXPECT_EQ(after(waiting), learned);
  // An ordinary interval: averaged (0.45 x 4,000 / 15 = 120 with 80: 100).
  Signals busier = measuredPool(3030);
  busier.decode_kv_used_ratio = 0.45;
  EXPECT_NEAR(after(busier), 100, 1e-9);
}

TEST(PlannerTest, AScaleUpCheckUnderABudgetTakesTheRoomTheBudgetMakesAndNoMore) {
  // 6 + 6 of a 12-GPU budget; prefill's TTFT missed (the load tripled),
  // decode far from its targets: the budget cuts decode for prefill's growth.
  PlannerConfig c = config();
  c.gpu_budget = 12;
  PlannerState state;
  decide(c, steadyPool(3000, 6, 6, 40000), state);
  Signals step = steadyPool(3010, 6, 6, 120000);
  step.prefill_queue_tokens = step.prefill_queue_peak_tokens = 200000;
  step.ttft_p95_s = 8;
  step.decode_kv_used_ratio = step.decode_kv_active_ratio = 0.1;
  step.decode_running = 12;
  const Decision d = checkScaleUp(c, step, state);
  EXPECT_GT(d.prefill.desired, 6) << d.prefill.message;
  EXPECT_LT(d.decode.desired, 6) << d.decode.message;
  EXPECT_EQ(d.decode.reason, Reason::kBudget) << d.decode.message;
  EXPECT_LE(d.prefill.desired + d.decode.desired, 12);
  EXPECT_EQ(state.decode.last_direction, -1);

  // The other role's shrink is its own (not the budget's): held for the
  // interval, so the growth waits for its room, and says so.
  PlannerConfig tight = config();
  tight.gpu_budget = 12;
  tight.scale_down_cooldown_s = 60;
  PlannerState st;
  decide(tight, steadyPool(0, 6, 6, 40000), st);
  Signals more = steadyPool(100, 6, 6, 55000);
  more.ttft_p95_s = 3;
  more.decode_kv_used_ratio = more.decode_kv_active_ratio = 0.5;
  more.decode_running = 60;
  PlannerState full_state = st;
  const Decision interval = decide(tight, more, full_state);
  ASSERT_EQ(interval.prefill.desired, 7) << interval.prefill.message;
  ASSERT_EQ(interval.decode.reason, Reason::kScaleDown) << interval.decode.message;
  const Decision held = checkScaleUp(tight, more, st);
  EXPECT_FALSE(held.acted());
  EXPECT_EQ(held.prefill.reason, Reason::kBudget);
  EXPECT_THAT(held.prefill.message, HasSubstr("would go 6 -> 7 (ScaleUp); the GPU budget of 12 holds 6"));
  EXPECT_FALSE(st.prefill.last_up_s);

  // Missing data: a check does nothing either.
  Signals missing = step;
  missing.missing = {"tandem_router_ttft_seconds"};
  PlannerState fresh;
  EXPECT_FALSE(checkScaleUp(c, missing, fresh).acted());
}

TEST(PlannerTest, ConfigErrorsNameTheField) {
  PlannerConfig c;
  c.ttft_target_s = 0;
  EXPECT_THAT(validatePlannerConfig(c).message(), HasSubstr("spec.autoscaling.ttftP95TargetSeconds"));
  c = {};
  c.decode = {5, 2};
  EXPECT_THAT(validatePlannerConfig(c).message(), HasSubstr("spec.autoscaling.decode: min 5 and max 2"));
  c = {};
  c.min_free_kv_ratio = 1;
  EXPECT_THAT(validatePlannerConfig(c).message(), HasSubstr("minFreeKvRatio"));
  c = {};
  c.scale_up_check_s = 45;
  EXPECT_THAT(validatePlannerConfig(c).message(), HasSubstr("spec.autoscaling.scaleUpCheck"));
  c.scale_up_check_s = -1;
  EXPECT_THAT(validatePlannerConfig(c).message(), HasSubstr("spec.autoscaling.scaleUpCheck"));
  EXPECT_TRUE(validatePlannerConfig(PlannerConfig{}).ok());
}

}  // namespace
}  // namespace tandem::planner
