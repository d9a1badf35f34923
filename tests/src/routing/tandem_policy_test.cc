#include "src/routing/tandem_policy.h"

#include <gtest/gtest.h>

#include "tests/src/routing/routing_test_util.h"

namespace tandem::routing {
namespace {

using namespace test_util;  // NOLINT: test helpers

TEST(TandemPolicyTest, ResidentSessionWithShortSuffixGoesDirect) {
  ClusterState c;
  addWorker(c, {.name = "p0", .role = WorkerRole::kPrefill});
  addWorker(c, {.name = "d0"});
  addWorker(c, {.name = "d1", .sessions = {resident("s1", chain(100, 50))}});
  InFlight f;
  TandemPolicy p;
  Decision d = mustRoute(p, request("s1", chain(100, 52)), c, f);
  EXPECT_EQ(d.decode, "d1");
  EXPECT_EQ(d.path, RoutePath::kDirect);
  EXPECT_EQ(d.reason, DecisionReason::kSticky);
  EXPECT_FALSE(d.prefill.has_value());
  EXPECT_EQ(d.decode_cached_blocks, 50);
  EXPECT_EQ(d.prefill_tokens, 2 * kBlockSize);
}

TEST(TandemPolicyTest, NewSessionGoesDisaggThroughAPrefillWorker) {
  ClusterState c;
  addWorker(c, {.name = "p0", .role = WorkerRole::kPrefill});
  addWorker(c, {.name = "d0"});
  InFlight f;
  TandemPolicy p;
  Decision d = mustRoute(p, request("s1", chain(100, 10)), c, f);
  EXPECT_EQ(d.decode, "d0");
  EXPECT_EQ(d.path, RoutePath::kDisagg);
  EXPECT_EQ(d.prefill, "p0");
  EXPECT_EQ(d.prefill_tokens, 10 * kBlockSize);
}

TEST(TandemPolicyTest, NoDecodeWorkerIsATypedResult) {
  ClusterState c;
  addWorker(c, {.name = "p0", .role = WorkerRole::kPrefill});
  InFlight f;
  TandemPolicy p;
  RouteResult r = p.route(request("s1", chain(100, 10)), c, f);
  ASSERT_TRUE(std::holds_alternative<NoWorker>(r));
  EXPECT_EQ(std::get<NoWorker>(r).reason, NoWorkerReason::kNoDecodeWorker);
}

TEST(TandemPolicyTest, UnhealthyAndDrainingWorkersAreNotRoutedTo) {
  ClusterState c;
  addWorker(c, {.name = "d0", .sessions = {resident("s1", chain(100, 10))}});
  addWorker(c, {.name = "d1", .draining = true, .cached = chain(100, 10)});
  addWorker(c, {.name = "d2"});
  c.setHealthy("d0", false);
  InFlight f;
  TandemPolicy p;
  EXPECT_EQ(mustRoute(p, request("s1", chain(100, 11)), c, f).decode, "d2");
  c.setHealthy("d2", false);
  RouteResult r = p.route(request("s1", chain(100, 11)), c, f);
  ASSERT_TRUE(std::holds_alternative<NoWorker>(r));
  EXPECT_EQ(std::get<NoWorker>(r).reason, NoWorkerReason::kNoDecodeWorker);
  c.setHealthy("d0", true);
  EXPECT_EQ(mustRoute(p, request("s1", chain(100, 11)), c, f).decode, "d0");
}

TEST(TandemPolicyTest, ContextThatFitsNowhereIsATypedNoWorker) {
  ClusterState c;
  addWorker(c, {.name = "d0", .max_context_tokens = 4096});
  addWorker(c, {.name = "d1", .total_blocks = 100});  // 1600 tokens of KV in all
  InFlight f;
  TandemPolicy p;
  // 200 blocks of prompt = 3200 tokens + 64 out: fits d0's context, not d1's pool.
  EXPECT_EQ(mustRoute(p, request("s1", chain(100, 200)), c, f).decode, "d0");
  RouteResult r = p.route(request("s1", chain(100, 300)), c, f);
  ASSERT_TRUE(std::holds_alternative<NoWorker>(r));
  EXPECT_EQ(std::get<NoWorker>(r).reason, NoWorkerReason::kTooLong);
  EXPECT_EQ(noWorkerReasonName(NoWorkerReason::kTooLong), "too_long");
}

TEST(TandemPolicyTest, TheReservationIsPromptMinusCachedPlusOutput) {
  // d0 holds 90 of the 100 prompt blocks and has 20 free: 10 uncached + 4 of
  // output (64 tokens) = 14 blocks fit. d1 is empty with 50 free: 104 do not.
  ClusterState c;
  addWorker(c, {.name = "d0", .total_blocks = 200, .free_blocks = 20, .running = 9, .cached = chain(100, 90)});
  addWorker(c, {.name = "d1", .total_blocks = 200, .free_blocks = 50});
  InFlight f;
  TandemPolicy p({.load_floor_weight = 100});  // however strongly d1's idleness pulls
  Decision d = mustRoute(p, request(std::nullopt, chain(100, 100)), c, f);
  EXPECT_EQ(d.decode, "d0");
  EXPECT_EQ(d.reserve_blocks, 14);
  EXPECT_EQ(d.num_feasible, 1);
}

TEST(TandemPolicyTest, IdleResidentSessionsOfOthersCountAsAvailable) {
  // d0 has no free blocks, but 60 blocks of another idle session that its
  // scheduler evicts to admit; its own session's blocks do not count twice.
  ClusterState c;
  addWorker(c, {.name = "d0",
                .total_blocks = 200,
                .free_blocks = 0,
                .sessions = {resident("s1", chain(100, 40)), resident("other", chain(9000, 60))}});
  addWorker(c, {.name = "d1", .total_blocks = 200, .free_blocks = 0});
  InFlight f;
  TandemPolicy p;
  // s1's next turn: 10 new blocks + 4 of output = 14 <= 60.
  Decision d = mustRoute(p, request("s1", chain(100, 50)), c, f);
  EXPECT_EQ(d.decode, "d0");
  EXPECT_EQ(d.num_feasible, 1);
  EXPECT_EQ(d.path, RoutePath::kDirect);
  // For a new session both idle sessions are evictable: 100 blocks.
  EXPECT_EQ(mustRoute(p, request("s2", chain(5000, 97)), c, f).reason, DecisionReason::kNoneFree);  // 97 + 4 > 100
  Decision fits = mustRoute(p, request("s2", chain(5000, 96)), c, f);
  EXPECT_EQ(fits.decode, "d0");
  EXPECT_EQ(fits.reason, DecisionReason::kLeastLoaded);
}

TEST(TandemPolicyTest, WhenNothingFitsNowTheLeastLoadedThatCanHoldItQueuesIt) {
  ClusterState c;
  addWorker(c, {.name = "d0", .total_blocks = 200, .free_blocks = 0, .running = 5});
  addWorker(c, {.name = "d1", .total_blocks = 200, .free_blocks = 3, .running = 2});
  addWorker(c, {.name = "d2", .total_blocks = 20, .free_blocks = 20});  // too small ever
  InFlight f;
  TandemPolicy p;
  Decision d = mustRoute(p, request("s1", chain(100, 50)), c, f);
  EXPECT_EQ(d.decode, "d1");
  EXPECT_EQ(d.reason, DecisionReason::kNoneFree);
  EXPECT_EQ(d.num_feasible, 0);
}

TEST(TandemPolicyTest, WithoutPrefillWorkersDecodeComputesThePrompt) {
  ClusterState c;
  addWorker(c, {.name = "d0"});
  InFlight f;
  TandemPolicy p;
  Decision d = mustRoute(p, request("s1", chain(100, 10)), c, f);
  EXPECT_EQ(d.path, RoutePath::kDirect);
  EXPECT_EQ(d.prefill_tokens, 10 * kBlockSize);
}

TEST(TandemPolicyTest, WorkersOfRoleBothServeAsPrefillAndDecode) {
  ClusterState c;
  addWorker(c, {.name = "b0", .role = WorkerRole::kBoth, .cached = chain(100, 10)});
  InFlight f;
  TandemPolicy p;
  Decision d = mustRoute(p, request("s1", chain(100, 12)), c, f);
  EXPECT_EQ(d.decode, "b0");
  EXPECT_EQ(d.path, RoutePath::kDirect) << "its own prefill worker: no transfer";
  EXPECT_EQ(d.prefill_tokens, 2 * kBlockSize);
  // A second one with the prompt cached: it prefills, b0 decodes.
  addWorker(c, {.name = "b1", .role = WorkerRole::kBoth, .running = 9, .cached = chain(100, 12)});
  d = mustRoute(p, request("s2", chain(100, 12)), c, f);
  EXPECT_EQ(d.decode, "b0");
  EXPECT_EQ(d.prefill, "b1");
  EXPECT_EQ(d.prefill_tokens, 0);
}

TEST(TandemPolicyTest, AStalePrefillWorkerEarnsNoOverlapCredit) {
  ClusterState c;
  addWorker(c, {.name = "d0"});
  addWorker(c, {.name = "p0", .role = WorkerRole::kPrefill, .cached = chain(100, 10)});
  InFlight f;
  TandemPolicy p;
  EXPECT_EQ(mustRoute(p, request("s1", chain(100, 10)), c, f).prefill_tokens, 0);
  c.markStale("p0");
  Decision d = mustRoute(p, request("s1", chain(100, 10)), c, f);
  EXPECT_EQ(d.prefill, "p0");  // still routable
  EXPECT_EQ(d.prefill_tokens, 10 * kBlockSize);
}

TEST(TandemPolicyTest, InFlightCountsUntilRemovedAndForgetsAReplacedWorker) {
  ClusterState c;
  addWorker(c, {.name = "d0"});
  addWorker(c, {.name = "p0", .role = WorkerRole::kPrefill});
  InFlight f;
  TandemPolicy p;
  Decision d = mustRoute(p, request("s1", chain(100, 10)), c, f);
  f.add(d);
  EXPECT_EQ(f.at(d.decode_ref).requests, 1);
  EXPECT_EQ(f.at(d.decode_ref).blocks, d.reserve_blocks);
  EXPECT_EQ(f.at(*d.prefill_ref).tokens, 10 * kBlockSize);
  f.remove(d);
  EXPECT_EQ(f.at(d.decode_ref).requests, 0);
  EXPECT_EQ(f.at(*d.prefill_ref).tokens, 0);

  f.add(d);
  c.removeWorker("d0");
  addWorker(c, {.name = "d9"});  // takes d0's slot
  WorkerRef d9 = c.worker(*c.find("d9"))->ref;
  EXPECT_EQ(d9.slot, d.decode_ref.slot);
  EXPECT_EQ(f.at(d9).requests, 0) << "d0's in-flight load is not d9's";
  f.remove(d);  // the old decision finishing later changes nothing for d9
  EXPECT_EQ(f.at(d9).requests, 0);
}

TEST(TandemPolicyTest, MigrationThatWouldExcludeEveryWorkerFallsBackToThem) {
  ClusterState c;
  addWorker(c, {.name = "d0", .sessions = {resident("s1", chain(100, 10))}});
  InFlight f;
  TandemPolicy p({.capacity_rejections_to_migrate = 1});
  RouteRequest r = request("s1", chain(100, 11));
  Decision d = mustRoute(p, r, c, f);
  p.onRejected(r, d, RejectReason::kCapacity);
  d = mustRoute(p, r, c, f);
  EXPECT_EQ(d.decode, "d0");
  EXPECT_EQ(d.reason, DecisionReason::kMigrated);
}

TEST(TandemPolicyTest, RejectionCountsOfAbandonedSessionsAreBounded) {
  ClusterState c;
  addWorker(c, {.name = "d0"});
  InFlight f;
  TandemPolicy p;
  Decision d = mustRoute(p, request("s", chain(100, 1)), c, f);
  for (size_t i = 0; i < TandemPolicy::kMaxTrackedMigrations + 10; ++i) {
    p.onRejected(request("s" + std::to_string(i), {}), d, RejectReason::kCapacity);
    ASSERT_LE(p.numTrackedMigrations(), TandemPolicy::kMaxTrackedMigrations);
  }
  EXPECT_EQ(p.numTrackedMigrations(), 10u);
  p.onFinished(request("s" + std::to_string(TandemPolicy::kMaxTrackedMigrations + 9), {}), d);
  EXPECT_EQ(p.numTrackedMigrations(), 9u);
}

TEST(TandemPolicyTest, NamesForLogsAndLabels) {
  EXPECT_EQ(routePathName(RoutePath::kDirect), "direct");
  EXPECT_EQ(routePathName(RoutePath::kDisagg), "disagg");
  EXPECT_EQ(decisionReasonName(DecisionReason::kLeastLoaded), "least_loaded");
  EXPECT_EQ(rejectReasonName(RejectReason::kQueueFull), "queue_full");
  EXPECT_EQ(TandemPolicy().name(), "tandem");
  Decision d{.decode = "d1", .prefill = "p0", .path = RoutePath::kDisagg, .reason = DecisionReason::kScored};
  d.reserve_blocks = 14;
  d.prefill_tokens = 650;
  d.decode_cached_blocks = 40;
  d.score = 1.25;
  d.num_feasible = 3;
  EXPECT_EQ(describeDecision(d),
            "decode=d1 prefill=p0 path=disagg reason=scored score=1.25 decode_cached=40 prefill_cached=0 reserve=14 "
            "prefill_tokens=650 feasible=3");
}

}  // namespace
}  // namespace tandem::routing
