// What each RouterConfig knob does: every test routes the same scenario with
// the default and with the knob changed, and the decision differs.

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "src/common/strings.h"

#include "src/routing/router_config.h"
#include "src/routing/tandem_policy.h"
#include "tests/src/routing/routing_test_util.h"

namespace tandem::routing {
namespace {

using namespace test_util;  // NOLINT: test helpers

Decision routeWith(RouterConfig config, const ClusterState& c, const RouteRequest& r) {
  TandemPolicy p(config);
  InFlight f;
  return mustRoute(p, r, c, f);
}

TEST(RouterConfigKnobs, OverlapWeightTradesCacheHitsAgainstQueueing) {
  // d0 holds 8 of the prompt's 10 blocks but has 5 queued; d1 holds nothing.
  ClusterState c;
  addWorker(c, {.name = "d0", .waiting = 5, .cached = chain(100, 8)});
  addWorker(c, {.name = "d1"});
  RouteRequest r = request(std::nullopt, chain(100, 10));
  RouterConfig config{.load_floor_weight = 0};
  EXPECT_EQ(routeWith(config, c, r).decode, "d0");  // 0.8 - 0.5 > 0
  config.overlap_weight = 0.3;
  EXPECT_EQ(routeWith(config, c, r).decode, "d1");  // 0.24 - 0.5 < 0
}

TEST(RouterConfigKnobs, StickyWeightKeepsASessionWhereItIsResident) {
  // s1 is resident on d0 with 2 blocks of this prompt; d1 caches 9.
  ClusterState c;
  addWorker(c, {.name = "d0", .sessions = {resident("s1", chain(100, 2))}});
  addWorker(c, {.name = "d1", .cached = chain(100, 9)});
  RouteRequest r = request("s1", chain(100, 10));
  Decision d = routeWith({}, c, r);
  EXPECT_EQ(d.decode, "d0");
  EXPECT_EQ(d.reason, DecisionReason::kSticky);
  EXPECT_EQ(routeWith({.sticky_weight = 0}, c, r).decode, "d1");
}

TEST(RouterConfigKnobs, LoadFloorWeightPullsNewSessionsToUnderusedWorkers) {
  // d0 and d1 hold the shared system prompt and two sessions each; d2 is cold.
  ClusterState c;
  auto sys = chain(100, 8);
  for (const char* d : {"d0", "d1"}) {
    addWorker(c, {.name = d,
                  .cached = sys,
                  .sessions = {resident(std::string(d) + "a", chain(5000, 2)),
                               resident(std::string(d) + "b", chain(6000, 2))}});
  }
  addWorker(c, {.name = "d2"});
  RouteRequest fresh = request("new", concat(sys, chain(9000, 2)));
  EXPECT_EQ(routeWith({}, c, fresh).decode, "d2");
  EXPECT_NE(routeWith({.load_floor_weight = 0}, c, fresh).decode, "d2");
}

TEST(RouterConfigKnobs, LoadFloorBonusIsGraduatedBelowTheMean) {
  // Both hold half the prompt; d0 runs 4, d1 runs 2: mean 3, so d1 gets
  // 1.5 * (3 - 2) / 3 = 0.5 on top of its 0.5 overlap.
  ClusterState c;
  addWorker(c, {.name = "d0", .running = 4, .cached = chain(100, 5)});
  addWorker(c, {.name = "d1", .running = 2, .cached = chain(100, 5)});
  Decision d = routeWith({}, c, request("s1", chain(100, 10)));
  EXPECT_EQ(d.decode, "d1");
  EXPECT_DOUBLE_EQ(d.score, 1.0);
  EXPECT_DOUBLE_EQ(routeWith({.load_floor_weight = 3.0}, c, request("s1", chain(100, 10))).score, 1.5);
}

TEST(RouterConfigKnobs, LoadFloorWithoutSessionExtendsTheBonusToSessionlessRequests) {
  // d0 holds the whole prompt and runs 2 requests; d1 is idle and holds nothing.
  ClusterState c;
  addWorker(c, {.name = "d0", .running = 2, .cached = chain(100, 10)});
  addWorker(c, {.name = "d1"});
  RouteRequest sessionless = request(std::nullopt, chain(100, 10));
  EXPECT_EQ(routeWith({}, c, sessionless).decode, "d0");  // follows its prefix: 1.0 vs 0
  EXPECT_EQ(routeWith({.load_floor_without_session = true}, c, sessionless).decode, "d1");  // 1.0 vs 1.5
  EXPECT_EQ(routeWith({}, c, request("s1", chain(100, 10))).decode, "d1");                  // a session gets it anyway
}

TEST(RouterConfigKnobs, LoadFloorBonusNeverPullsASessionResidentElsewhere) {
  // s1 is resident on a busy d0; d1 is idle. The bonus is not offered to d1
  // however large it is.
  ClusterState c;
  addWorker(c, {.name = "d0", .running = 6, .sessions = {resident("s1", chain(100, 10))}});
  addWorker(c, {.name = "d1"});
  RouteRequest r = request("s1", chain(100, 11));
  EXPECT_EQ(routeWith({.load_floor_weight = 100}, c, r).decode, "d0");
  // A new session does get it.
  EXPECT_EQ(routeWith({.load_floor_weight = 100}, c, request("s2", chain(100, 11))).decode, "d1");
}

TEST(RouterConfigKnobs, QueuePenaltyMovesWorkOffAQueuedWorker) {
  // s1 is resident on d0, which has 30 requests waiting.
  ClusterState c;
  addWorker(c, {.name = "d0", .waiting = 30, .sessions = {resident("s1", chain(100, 10))}});
  addWorker(c, {.name = "d1"});
  RouteRequest r = request("s1", chain(100, 11));
  EXPECT_EQ(routeWith({}, c, r).decode, "d1");  // 2 + 0.9 - 3.0 < 0
  EXPECT_EQ(routeWith({.queue_penalty = 0}, c, r).decode, "d0");
}

TEST(RouterConfigKnobs, TieEpsilonLetsTheRendezvousHashSpreadNearTies) {
  // d0 holds all 40 blocks of the shared prefix, d1 39: scores 0.025 apart.
  ClusterState c;
  addWorker(c, {.name = "d0", .cached = chain(100, 40)});
  addWorker(c, {.name = "d1", .cached = chain(100, 39)});
  int to_d1_default = 0, to_d1_strict = 0;
  for (int s = 0; s < 40; ++s) {
    RouteRequest r = request("s" + std::to_string(s), chain(100, 40));
    to_d1_default += routeWith({}, c, r).decode == "d1" ? 1 : 0;
    to_d1_strict += routeWith({.tie_epsilon = 0}, c, r).decode == "d1" ? 1 : 0;
  }
  EXPECT_GT(to_d1_default, 5);
  EXPECT_LT(to_d1_default, 35);
  EXPECT_EQ(to_d1_strict, 0);
}

TEST(RouterConfigKnobs, MissMaxBlocksDecidesWhatCountsAsAMiss) {
  // d0 holds just the first block and runs 1 request; d1 is idle and holds nothing.
  ClusterState c;
  addWorker(c, {.name = "d0", .running = 1, .cached = chain(100, 1)});
  addWorker(c, {.name = "d1"});
  RouteRequest r = request(std::nullopt, chain(100, 10));
  Decision scored = routeWith({.load_floor_weight = 0}, c, r);
  EXPECT_EQ(scored.decode, "d0");
  EXPECT_EQ(scored.reason, DecisionReason::kScored);
  Decision miss = routeWith({.load_floor_weight = 0, .miss_max_blocks = 1}, c, r);
  EXPECT_EQ(miss.decode, "d1");
  EXPECT_EQ(miss.reason, DecisionReason::kLeastLoaded);
}

TEST(RouterConfigKnobs, DirectMaxSuffixTokensChoosesTheDirectPath) {
  ClusterState c;
  addWorker(c, {.name = "p0", .role = WorkerRole::kPrefill});
  addWorker(c, {.name = "d0", .sessions = {resident("s1", chain(100, 40))}});
  RouteRequest r = request("s1", chain(100, 40), 100);  // 100 tokens beyond what d0 holds
  EXPECT_EQ(routeWith({}, c, r).path, RoutePath::kDirect);
  Decision d = routeWith({.direct_max_suffix_tokens = 50}, c, r);
  EXPECT_EQ(d.path, RoutePath::kDisagg);
  EXPECT_EQ(d.prefill, "p0");
}

TEST(RouterConfigKnobs, PrefillOverloadTokensPassesOverAnOverloadedPrefillWorker) {
  // p0 caches the prompt but has 66K tokens queued (over the 65536 default); p1 has 64K, no cache.
  ClusterState c;
  addWorker(c, {.name = "d0"});
  addWorker(c, {.name = "p0", .role = WorkerRole::kPrefill, .waiting_prompt_tokens = 66'000, .cached = chain(100, 10)});
  addWorker(c, {.name = "p1", .role = WorkerRole::kPrefill, .waiting_prompt_tokens = 64'000});
  RouteRequest r = request("s1", chain(100, 10));
  EXPECT_EQ(routeWith({}, c, r).prefill, "p1");
  Decision d = routeWith({.prefill_overload_tokens = 100'000}, c, r);
  EXPECT_EQ(d.prefill, "p0");
  EXPECT_EQ(d.prefill_cached_blocks, 10);
  EXPECT_EQ(d.prefill_tokens, 0);
}

TEST(RouterConfigKnobs, PrefillBalanceTokensLetsPrefillOverlapBreakNearTies) {
  // p0 caches the prompt with 3000 tokens queued; p1 is idle without it.
  ClusterState c;
  addWorker(c, {.name = "d0"});
  addWorker(c, {.name = "p0", .role = WorkerRole::kPrefill, .waiting_prompt_tokens = 3000, .cached = chain(100, 10)});
  addWorker(c, {.name = "p1", .role = WorkerRole::kPrefill});
  RouteRequest r = request("s1", chain(100, 10));
  EXPECT_EQ(routeWith({}, c, r).prefill, "p1");
  EXPECT_EQ(routeWith({.prefill_balance_tokens = 4096}, c, r).prefill, "p0");
}

TEST(RouterConfigKnobs, CapacityRejectionsToMigrateSetsTheBackstop) {
  ClusterState c;
  addWorker(c, {.name = "d0", .sessions = {resident("s1", chain(100, 10))}});
  addWorker(c, {.name = "d1"});
  RouteRequest r = request("s1", chain(100, 11));
  for (int k : {1, 2, 3}) {
    TandemPolicy p({.capacity_rejections_to_migrate = k});
    InFlight f;
    int rejections = 0;
    Decision d = mustRoute(p, r, c, f);
    while (d.decode == "d0" && rejections < 10) {
      p.onRejected(r, d, RejectReason::kCapacity);
      ++rejections;
      d = mustRoute(p, r, c, f);
    }
    EXPECT_EQ(rejections, k);
    EXPECT_EQ(d.decode, "d1");
    EXPECT_EQ(d.reason, DecisionReason::kMigrated);
    // Served there: the migration is done, worker state leads again.
    p.onFinished(r, d);
    EXPECT_EQ(mustRoute(p, r, c, f).decode, "d0");
  }
}

TEST(RouterConfigKnobs, ValidationNamesTheKnobOutOfRange) {
  EXPECT_TRUE(validateRouterConfig({}).ok());
  absl::Status s = validateRouterConfig({.sticky_weight = -1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(toStd(s.message()).find("sticky_weight"), std::string_view::npos);
  EXPECT_FALSE(validateRouterConfig({.prefill_balance_tokens = -5}).ok());
  EXPECT_FALSE(validateRouterConfig({.capacity_rejections_to_migrate = 0}).ok());
}

}  // namespace
}  // namespace tandem::routing
