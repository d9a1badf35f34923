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

}  // namespace
}  // namespace tandem::routing
