// The baseline policies against a real ClusterState: round robin, least
// load, and SGLang's cache_aware with its documented defaults.

#include "e2e/replay/baseline_policies.h"

#include <gtest/gtest.h>

#include "e2e/replay/cache_aware_policy.h"
#include "e2e/replay/trace.h"
#include "src/common/block_hash.h"
#include "src/common/strings.h"

namespace tandem::replay {
namespace {

using routing::Decision;
using routing::RouteRequest;

class BaselinePoliciesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 3; ++i) {
      routing::WorkerSnapshot s;
      s.epoch = 1;
      s.worker = strCat("w", i);
      s.role = routing::WorkerRole::kDecode;
      s.block_size = kTraceBlockTokens;
      s.hash_root = kBlockHashRoot;
      s.load.total_blocks = 1000;
      s.load.free_blocks = 1000;
      ASSERT_TRUE(cluster_.applySnapshot(s).ok());
    }
  }

  static RouteRequest request(std::vector<uint64_t> ids) {
    RouteRequest r;
    r.prompt_hashes = chainTraceHashes(ids);
    r.prompt_tokens = static_cast<int64_t>(ids.size()) * kTraceBlockTokens;
    r.expected_output_tokens = 10;
    return r;
  }

  // Routes and assigns; returns the chosen worker's name.
  std::string send(routing::Policy& p, const RouteRequest& r) {
    routing::RouteResult result = p.route(r, cluster_, in_flight_);
    const Decision& d = std::get<Decision>(result);
    p.onAssigned(r, d);
    sent_.push_back(d);
    return d.decode;
  }

  routing::ClusterState cluster_;
  routing::InFlight in_flight_;
  std::vector<Decision> sent_;
};

TEST_F(BaselinePoliciesTest, RoundRobinCyclesInSlotOrder) {
  RoundRobinPolicy p;
  std::vector<std::string> got;
  for (int i = 0; i < 4; ++i) got.push_back(send(p, request({1})));
  EXPECT_EQ(got, (std::vector<std::string>{"w0", "w1", "w2", "w0"}));
}

TEST_F(BaselinePoliciesTest, LeastLoadCountsOutstandingRequests) {
  LeastLoadPolicy p;
  EXPECT_EQ(send(p, request({1})), "w0");
  EXPECT_EQ(send(p, request({1})), "w1");
  EXPECT_EQ(send(p, request({1})), "w2");
  p.onFinished(request({1}), sent_[1]);  // w1 is free again
  EXPECT_EQ(send(p, request({1})), "w1");
  p.onRejected(request({1}), sent_[2], routing::RejectReason::kQueueFull);
  EXPECT_EQ(send(p, request({1})), "w2");
}

TEST_F(BaselinePoliciesTest, CacheAwareFollowsAPrefixAboveTheThreshold) {
  CacheAwarePolicy p;
  // Empty trees: the smallest tree (lowest slot on a tie) gets each new prefix.
  EXPECT_EQ(send(p, request({1, 2, 3, 4})), "w0");
  EXPECT_EQ(send(p, request({9, 8, 7, 6})), "w1");
  // 3 of 4 blocks (0.75 > 0.3) match what w0 was sent.
  EXPECT_EQ(send(p, request({1, 2, 3, 5})), "w0");
  // 1 of 4 (0.25 <= 0.3): the smallest tree, w2, whatever the load.
  EXPECT_EQ(send(p, request({1, 20, 21, 22})), "w2");
}

TEST_F(BaselinePoliciesTest, CacheAwareBalancesOnlyPastBothThresholds) {
  CacheAwarePolicy p;
  send(p, request({1, 2}));  // w0 holds the prefix
  send(p, request({5, 6}));  // w1
  send(p, request({7, 8}));  // w2
  // w0 gets the prefix while max - min <= 64 (the 65th send sees 64: not more).
  for (int i = 0; i < 65; ++i) EXPECT_EQ(send(p, request({1, 2})), "w0") << i;
  // Now 66 vs 1: 65 > 64 and 66 > 1.5 * 1, imbalanced: the least loaded.
  EXPECT_EQ(send(p, request({1, 2})), "w1");
}

TEST_F(BaselinePoliciesTest, CacheAwareTreeIsCutBackToItsLimit) {
  CacheAwarePolicy p(CacheAwareConfig{.max_tree_blocks = 2});
  EXPECT_EQ(send(p, request({1, 2, 3, 4})), "w0");  // w0's tree keeps blocks 1 and 2
  // 2 of 7 blocks match (0.29 <= 0.3); with all 4 kept it would be 0.57 and w0.
  EXPECT_EQ(send(p, request({1, 2, 3, 4, 5, 6, 7})), "w1");
}

TEST(ApproxTreeTest, EvictsLeavesFirstAndReportsTheMostRecentHolder) {
  ApproxTree tree;
  const std::vector<BlockHash> a = chainTraceHashes({1, 2, 3});
  tree.insert(a, 0, 1, 100);
  tree.insert(std::span(a).first(2), 1, 2, 100);
  ApproxTree::Match m = tree.prefixMatch(a);
  EXPECT_EQ(m.blocks, 3);
  EXPECT_EQ(m.tenant, std::optional<ApproxTree::Tenant>(0));  // only 0 holds the third block
  m = tree.prefixMatch(std::span(a).first(2));
  EXPECT_EQ(m.tenant, std::optional<ApproxTree::Tenant>(1));  // both hold it; 1 more recently
  tree.insert(chainTraceHashes({7}), 0, 3, 2);                // tenant 0 cut back to 2 blocks
  EXPECT_EQ(tree.size(0), 2);
  EXPECT_EQ(tree.prefixMatch(a).blocks, 2);  // its leaf (block 3) went first
  EXPECT_EQ(tree.prefixMatch(chainTraceHashes({7})).blocks, 1);
}

}  // namespace
}  // namespace tandem::replay
