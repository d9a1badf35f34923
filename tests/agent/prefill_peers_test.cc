// Which prefill peer serves a request (PrefillPeers::choose), on a FakeClock.

#include "agent/prefill_peers.h"

#include <gtest/gtest.h>

#include "src/common/clock.h"

namespace tandem::agent {
namespace {

class PrefillPeersTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  // Three peers; each unhealthy after 2 failures within 10 s.
  PrefillPeers peers_{{{"p0", 1}, {"p1", 2}, {"p2", 3}}, {.failures = 2, .window = std::chrono::seconds(10)}, clock_};
  uint64_t seq_ = 0;

  void failTwice(size_t p) {
    peers_[p].health->recordFailure();
    peers_[p].health->recordFailure();
  }
  // A probe goes out and is answered.
  void probeAnswered(size_t p) {
    peers_[p].health->heartbeatSent(++seq_);
    ASSERT_TRUE(peers_[p].health->heartbeatAnswered(seq_));
  }
};

TEST_F(PrefillPeersTest, NamesAreHostPortAndFound) {
  EXPECT_EQ(peers_[1].name, "p1:2");
  EXPECT_EQ(peers_.find("p2:3"), 2u);
  EXPECT_FALSE(peers_.find("p2:4").has_value());
  EXPECT_FALSE(peers_.find("").has_value());
  peers_[2].conn = 7;
  EXPECT_EQ(peers_.byConn(7), 2u);
  EXPECT_FALSE(peers_.byConn(0).has_value()) << "0 is no connection";
}

TEST_F(PrefillPeersTest, TheNamedPeerWhenItIsUsable) {
  peers_[0].num_inflight = 0;
  peers_[2].num_inflight = 5;
  EXPECT_EQ(peers_.choose(2), 2u) << "the router's choice wins over load";
  failTwice(2);
  EXPECT_EQ(peers_.choose(2), 0u) << "unhealthy: D picks";
  probeAnswered(2);
  EXPECT_EQ(peers_.choose(2), 2u);
  peers_[2].incompatible = "another model";
  EXPECT_EQ(peers_.choose(2), 0u) << "known incompatible: D picks";
}

TEST_F(PrefillPeersTest, WithoutANameFewestInFlightTiesByOrder) {
  EXPECT_EQ(peers_.choose(std::nullopt), 0u);
  peers_[0].num_inflight = 2;
  peers_[1].num_inflight = 1;
  peers_[2].num_inflight = 1;
  EXPECT_EQ(peers_.choose(std::nullopt), 1u);
  failTwice(1);
  EXPECT_EQ(peers_.choose(std::nullopt), 2u);
}

TEST_F(PrefillPeersTest, IncompatiblePeersOnlyWhenNothingElseIsHealthy) {
  peers_[0].incompatible = "x";
  peers_[1].incompatible = "y";
  failTwice(2);
  // Only incompatible peers are healthy: one of them, whose transfer then
  // fails with the reason (as with a single incompatible peer).
  EXPECT_EQ(peers_.choose(std::nullopt), 0u);
  failTwice(0);
  failTwice(1);
  EXPECT_FALSE(peers_.choose(std::nullopt).has_value()) << "every peer unhealthy: fallback";
  // A peer that answers a probe is used again.
  clock_.advance(std::chrono::seconds(11));
  EXPECT_FALSE(peers_.choose(std::nullopt).has_value()) << "unhealthy until a probe answers";
  probeAnswered(2);
  EXPECT_EQ(peers_.choose(std::nullopt), 2u);
}

// A request moved off a peer is never sent back to it, even when it is the
// least loaded or the only healthy one left.
TEST_F(PrefillPeersTest, PeersARequestLeftAreNeverChosenForIt) {
  peers_[0].num_inflight = 0;
  peers_[1].num_inflight = 3;
  peers_[2].num_inflight = 5;
  EXPECT_EQ(peers_.choose(std::nullopt, {0}), 1u);
  EXPECT_EQ(peers_.choose(0, {0}), 1u) << "not even when named";
  EXPECT_EQ(peers_.choose(std::nullopt, {0, 1}), 2u);
  EXPECT_FALSE(peers_.choose(std::nullopt, {0, 1, 2}).has_value()) << "left them all: fallback";
  peers_[1].incompatible = "another model";
  peers_[2].incompatible = "another model";
  EXPECT_FALSE(peers_.choose(std::nullopt, {0}) == 0u) << "the last resort excludes them too";
}

TEST_F(PrefillPeersTest, DiscoveryAddsPeersAtTheEndAndRetiresOnesThatLeftWithoutMovingIndexes) {
  peers_[1].num_inflight = 1;  // a transfer holds index 1
  const std::vector<size_t> joined = peers_.sync({{"p1", 2}, {"p3", 4}});
  EXPECT_EQ(joined, std::vector<size_t>{3});
  ASSERT_EQ(peers_.size(), 4u);
  EXPECT_EQ(peers_[1].name, "p1:2") << "indexes never move";
  EXPECT_EQ(peers_[3].name, "p3:4");
  EXPECT_FALSE(peers_[0].member);
  EXPECT_TRUE(peers_[1].member);
  EXPECT_FALSE(peers_[2].member);
  // A peer that left is never chosen, even when named; the others are.
  EXPECT_EQ(peers_.choose(0u), 3u) << "p3 has nothing in flight";
  for (int i = 0; i < 5; ++i) {
    auto c = peers_.choose(std::nullopt);
    ASSERT_TRUE(c.has_value());
    EXPECT_TRUE(*c == 1 || *c == 3);
  }
  EXPECT_EQ(peers_.find("p0:1"), 0u) << "still found: what it had in flight can finish";
  // Listed again: a member again, same index, nothing new.
  EXPECT_TRUE(peers_.sync({{"p0", 1}, {"p1", 2}, {"p3", 4}}).empty());
  EXPECT_TRUE(peers_[0].member);
  EXPECT_EQ(peers_.size(), 4u);
  // Nobody left: nothing to choose (the request is prefilled locally).
  peers_.sync({});
  EXPECT_FALSE(peers_.choose(std::nullopt).has_value());
}

}  // namespace
}  // namespace tandem::agent
