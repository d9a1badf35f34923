// The router's routing state: a retry never returns to the worker it moves
// away from, a decode worker that cannot be reached sits out for the
// failure window only (never a permanent verdict), the router's own
// assignments count at once and stop counting when D has the request, and
// D's error codes map to typed reasons by exact name only.

#include "agent/router/router_core.h"

#include <gtest/gtest.h>

#include "agent/router/upstream_error.h"
#include "src/routing/tandem_policy.h"
#include "tests/src/routing/routing_test_util.h"

namespace tandem::agent {
namespace {

using routing::RejectReason;
using routing::WorkerRole;
using routing::test_util::snapshotOf;
using routing::test_util::WorkerSpec;

class RouterCoreTest : public ::testing::Test {
 protected:
  RouterCoreTest() : core_(std::make_unique<routing::TandemPolicy>(), clock_, {.unhealthy_failures = 2}) {
    for (const char* name : {"d0", "d1"}) add({.name = name});
    add({.name = "p0", .role = WorkerRole::kPrefill});
  }
  void add(const WorkerSpec& spec) {
    ASSERT_TRUE(core_.applySnapshot(snapshotOf(spec), "http://" + spec.name, spec.name + ":8200").ok());
  }
  RouterCore::Assignment route(const std::vector<std::string>& avoid = {}) {
    auto r = core_.route(request_, avoid);
    EXPECT_TRUE(std::holds_alternative<RouterCore::Assignment>(r));
    return std::get<RouterCore::Assignment>(r);
  }

  FakeClock clock_;
  RouterCore core_;
  routing::RouteRequest request_{.prompt_tokens = 64, .expected_output_tokens = 16};
};

TEST_F(RouterCoreTest, ARetryAvoidsTheWorkerItLeaves) {
  for (int i = 0; i < 20; ++i) {
    RouterCore::Assignment first = route();
    RouterCore::Assignment second = route({first.decision.decode});
    EXPECT_NE(second.decision.decode, first.decision.decode);
    core_.rejected(request_, first, RejectReason::kQueueFull);
    core_.finished(request_, second);
  }
}

TEST_F(RouterCoreTest, AvoidingEveryDecodeWorkerLeavesNone) {
  auto r = core_.route(request_, {"d0", "d1"});
  ASSERT_TRUE(std::holds_alternative<routing::NoWorker>(r));
  EXPECT_EQ(std::get<routing::NoWorker>(r).reason, routing::NoWorkerReason::kNoDecodeWorker);
  // The marks were for that decision only.
  route();
}

// A worker that stopped answering (its stream went silent) gets nothing
// while another can take the request; it is the last resort when none can,
// and gets work again once it answers.
TEST_F(RouterCoreTest, AnUnresponsiveWorkerIsOnlyTheLastResort) {
  EXPECT_TRUE(core_.otherResponsiveDecodeWorker("d0"));
  core_.setResponsive("d0", false);
  EXPECT_FALSE(core_.responsive("d0"));
  EXPECT_EQ(core_.unresponsiveSince("d0"), clock_.now());
  EXPECT_EQ(core_.numUnresponsive(), 1);
  EXPECT_TRUE(core_.otherResponsiveDecodeWorker("d0"));  // d1
  EXPECT_FALSE(core_.otherResponsiveDecodeWorker("d1"));  // d0 does not answer; p0 cannot decode
  core_.setResponsive("p0", false);
  EXPECT_EQ(core_.numUnresponsive(), 1);  // decode workers only
  core_.setResponsive("p0", true);
  for (int i = 0; i < 20; ++i) {
    RouterCore::Assignment a = route();
    EXPECT_EQ(a.decision.decode, "d1");
    core_.finished(request_, a);
  }
  auto none = core_.route(request_, {"d1"});
  ASSERT_TRUE(std::holds_alternative<routing::NoWorker>(none));
  auto last = core_.route(request_, {"d1"}, /*allow_unresponsive=*/true);
  ASSERT_TRUE(std::holds_alternative<RouterCore::Assignment>(last));
  EXPECT_EQ(std::get<RouterCore::Assignment>(last).decision.decode, "d0");
  core_.finished(request_, std::get<RouterCore::Assignment>(last));
  core_.setResponsive("d0", true);
  EXPECT_EQ(core_.numUnresponsive(), 0);
  EXPECT_EQ(core_.unresponsiveSince("d0"), std::nullopt);
  EXPECT_EQ(route({"d1"}).decision.decode, "d0");
}

TEST_F(RouterCoreTest, AnUnreachableWorkerSitsOutForTheWindowOnly) {
  RouterCore::Assignment a = route();
  const std::string bad = a.decision.decode;
  core_.unreachable(request_, a);
  RouterCore::Assignment b = route({a.decision.decode == "d0" ? "d1" : "d0"});
  ASSERT_EQ(b.decision.decode, bad);  // one failure: still routable
  core_.unreachable(request_, b);     // two within the window: benched
  for (int i = 0; i < 10; ++i) {
    RouterCore::Assignment c = route();
    EXPECT_NE(c.decision.decode, bad);
    core_.finished(request_, c);
  }
  clock_.advance(std::chrono::seconds(11));  // the failures leave the window
  RouterCore::Assignment d = route({bad == "d0" ? "d1" : "d0"});
  EXPECT_EQ(d.decision.decode, bad);
  core_.finished(request_, d);
}

TEST_F(RouterCoreTest, ASnapshotClearsTheFailures) {
  RouterCore::Assignment a = route();
  const std::string bad = a.decision.decode;
  core_.unreachable(request_, a);
  RouterCore::Assignment b = route({bad == "d0" ? "d1" : "d0"});
  core_.unreachable(request_, b);
  add({.name = bad});  // its stream reconnected
  RouterCore::Assignment c = route({bad == "d0" ? "d1" : "d0"});
  EXPECT_EQ(c.decision.decode, bad);
}

TEST_F(RouterCoreTest, InFlightCountsUntilAdmittedAndOnlyOnce) {
  std::vector<RouterCore::Assignment> burst;
  for (int i = 0; i < 6; ++i) burst.push_back(route());
  int64_t total = 0;
  for (const auto& w : core_.workerLoads()) total += w.in_flight;
  EXPECT_EQ(total, 6);
  // A burst spreads: both decode workers got some before either reported.
  int on_d0 = 0;
  for (const auto& a : burst) on_d0 += a.decision.decode == "d0";
  EXPECT_GT(on_d0, 0);
  EXPECT_LT(on_d0, 6);
  for (auto& a : burst) {
    core_.admitted(a);
    core_.finished(request_, a);  // does not release a second time
  }
  for (const auto& w : core_.workerLoads()) EXPECT_EQ(w.in_flight, 0) << w.name;
}

TEST_F(RouterCoreTest, ReadinessNeedsADecodeSnapshot) {
  FakeClock clock;
  RouterCore empty(std::make_unique<routing::TandemPolicy>(), clock);
  EXPECT_FALSE(empty.hasDecodeSnapshot());
  EXPECT_FALSE(empty.hashSpec().has_value());
  ASSERT_TRUE(empty.applySnapshot(snapshotOf({.name = "p", .role = WorkerRole::kPrefill}), "http://p", "p:1").ok());
  EXPECT_FALSE(empty.hasDecodeSnapshot());
  ASSERT_TRUE(empty.applySnapshot(snapshotOf({.name = "d"}), "http://d", "").ok());
  EXPECT_TRUE(empty.hasDecodeSnapshot());
  ASSERT_TRUE(empty.hashSpec().has_value());
  EXPECT_EQ(empty.hashSpec()->block_size, routing::test_util::kBlockSize);
  EXPECT_EQ(empty.address("p")->kv, "p:1");
  EXPECT_EQ(empty.address("d")->http, "http://d");
}

TEST(UpstreamErrorTest, CodesMapByExactNameOnly) {
  EXPECT_EQ(rejectReasonForCode("queue_full"), RejectReason::kQueueFull);
  EXPECT_EQ(rejectReasonForCode("draining"), RejectReason::kDraining);
  EXPECT_EQ(rejectReasonForCode("kv_capacity_exceeded"), RejectReason::kCapacity);
  EXPECT_EQ(rejectReasonForCode("prefill_timeout"), RejectReason::kPrefillFailed);
  EXPECT_EQ(rejectReasonForCode("unknown_prefill_peer"), RejectReason::kUnknownPrefill);
  // A substring of a known code, or a known code inside a message, is not one.
  EXPECT_EQ(rejectReasonForCode("queue"), std::nullopt);
  EXPECT_EQ(rejectReasonForCode("error: queue_full"), std::nullopt);
  EXPECT_EQ(rejectReasonForCode("QUEUE_FULL"), std::nullopt);
  EXPECT_EQ(rejectReasonForCode("invalid_request_error"), std::nullopt);
}

TEST(UpstreamErrorTest, OnlyRefusalsAnotherWorkerCouldServeAreRetried) {
  EXPECT_TRUE(retryElsewhere(RejectReason::kCapacity));
  EXPECT_TRUE(retryElsewhere(RejectReason::kQueueFull));
  EXPECT_TRUE(retryElsewhere(RejectReason::kDraining));
  EXPECT_TRUE(retryElsewhere(RejectReason::kPrefillFailed));
  EXPECT_FALSE(retryElsewhere(RejectReason::kPromptTooLong));
  EXPECT_FALSE(retryElsewhere(RejectReason::kUnknownPrefill));
}

}  // namespace
}  // namespace tandem::agent
