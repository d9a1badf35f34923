// Leader election against an in-memory API (FakeApi) with a FakeClock: all
// candidates tick on one thread, so every interleaving is reproducible.

#include <random>

#include <gtest/gtest.h>

#include "src/k8s/errors.h"
#include "src/k8s/leader_election.h"
#include "tests/src/k8s/fake_api.h"

namespace tandem::k8s {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::FakeApi;
using testing::FakeTransport;

constexpr char kLeasePath[] = "/apis/coordination.k8s.io/v1/namespaces/sys/leases/op";

class LeaderElectionTest : public ::testing::Test {
 protected:
  LeaderElectionTest() : client_(Client::createWithTransport(std::make_unique<FakeTransport>(api_))) {}

  std::unique_ptr<LeaderElector> candidate(const std::string& id, int* started = nullptr, int* stopped = nullptr) {
    auto e = LeaderElector::create(*client_, {.leaseNamespace = "sys",
                                              .leaseName = "op",
                                              .identity = id,
                                              .clock = &clock_,
                                              .onStartedLeading =
                                                  [started] {
                                                    if (started) ++*started;
                                                  },
                                              .onStoppedLeading =
                                                  [stopped] {
                                                    if (stopped) ++*stopped;
                                                  }});
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  }
  nlohmann::json leaseSpec() { return api_.objects[kLeasePath]["spec"]; }

  FakeClock clock_;
  FakeApi api_;
  std::unique_ptr<Client> client_;
};

TEST_F(LeaderElectionTest, ValidatesOptions) {
  EXPECT_FALSE(LeaderElector::create(*client_, {.leaseNamespace = "sys", .leaseName = "op"}).ok());
  EXPECT_FALSE(LeaderElector::create(*client_, {.leaseNamespace = "sys",
                                                .leaseName = "op",
                                                .identity = "a",
                                                .leaseDuration = seconds(10),
                                                .renewDeadline = seconds(10)})
                   .ok());
}

TEST_F(LeaderElectionTest, FirstCandidateCreatesLeaseWithStandardFields) {
  int started = 0;
  auto a = candidate("a", &started);
  auto b = candidate("b");
  ASSERT_TRUE(a->tick().ok());
  ASSERT_TRUE(b->tick().ok());
  EXPECT_TRUE(a->isLeader());
  EXPECT_FALSE(b->isLeader());
  EXPECT_EQ(b->leader(), "a");
  EXPECT_EQ(started, 1);
  nlohmann::json spec = leaseSpec();
  EXPECT_EQ(spec["holderIdentity"], "a");
  EXPECT_EQ(spec["leaseDurationSeconds"], 15);
  EXPECT_EQ(spec["leaseTransitions"], 0);
  EXPECT_EQ(spec["acquireTime"].get<std::string>().size(), std::string("2026-01-01T00:00:00.000000Z").size());

  clock_.advance(seconds(2));
  std::string acquired = spec["acquireTime"];
  ASSERT_TRUE(a->tick().ok());  // renew keeps acquireTime, moves renewTime
  EXPECT_EQ(leaseSpec()["acquireTime"], acquired);
  EXPECT_NE(leaseSpec()["renewTime"], spec["renewTime"]);
  EXPECT_EQ(started, 1);
}

TEST_F(LeaderElectionTest, TakeoverAfterLeaderStopsRenewing) {
  int aStopped = 0;
  auto a = candidate("a", nullptr, &aStopped);
  auto b = candidate("b");
  ASSERT_TRUE(a->tick().ok());
  MonoTime lastRenew = clock_.now();
  Duration takeover = Duration::zero();
  // a stops renewing (stalled); b tries every retryPeriod.
  for (int i = 0; i < 20 && !b->isLeader(); ++i) {
    ASSERT_TRUE(b->tick().ok());
    EXPECT_FALSE(a->isLeader() && b->isLeader());
    clock_.advance(seconds(2));
  }
  ASSERT_TRUE(b->isLeader());
  takeover = clock_.now() - seconds(2) - lastRenew;
  // Within leaseDuration (+ one retry period of b's polling).
  EXPECT_GE(takeover, seconds(15));
  EXPECT_LE(takeover, seconds(15) + seconds(2));
  EXPECT_FALSE(a->isLeader());  // its own renew deadline passed long ago
  EXPECT_EQ(leaseSpec()["holderIdentity"], "b");
  EXPECT_EQ(leaseSpec()["leaseTransitions"], 1);
  // a wakes up: sees b, stays follower, reports the loss once.
  ASSERT_TRUE(a->tick().ok());
  EXPECT_FALSE(a->isLeader());
  EXPECT_EQ(a->leader(), "b");
  EXPECT_EQ(aStopped, 1);
}

TEST_F(LeaderElectionTest, LeaderThatCannotRenewStepsDownAtRenewDeadline) {
  auto a = candidate("a");
  ASSERT_TRUE(a->tick().ok());
  api_.beforeRequest = [](const HttpRequest&) { return 500; };
  for (int i = 0; i < 4; ++i) {
    clock_.advance(seconds(2));
    EXPECT_FALSE(a->tick().ok());
    EXPECT_TRUE(a->isLeader());  // t = 2..8 s: still within 10 s
  }
  clock_.advance(seconds(2));  // t = 10 s
  EXPECT_FALSE(a->isLeader());
  EXPECT_FALSE(a->tick().ok());
  EXPECT_FALSE(a->isLeader());
}

TEST_F(LeaderElectionTest, ReleaseLetsTheNextCandidateInAtOnce) {
  auto a = candidate("a");
  auto b = candidate("b");
  ASSERT_TRUE(a->tick().ok());
  ASSERT_TRUE(b->tick().ok());
  ASSERT_TRUE(a->release().ok());
  EXPECT_FALSE(a->isLeader());
  EXPECT_EQ(leaseSpec()["holderIdentity"], "");
  EXPECT_EQ(leaseSpec()["leaseDurationSeconds"], 1);
  ASSERT_TRUE(b->tick().ok());
  EXPECT_TRUE(b->isLeader());
  EXPECT_EQ(leaseSpec()["leaseTransitions"], 1);
}

// Three candidates tick in random order with random gaps; requests take
// random (fake) time and sometimes fail; candidates stall for random spans.
// After every step at most one candidate may believe it leads, and whenever
// a candidate believes it leads the lease names it.
TEST_F(LeaderElectionTest, RandomizedNeverTwoLeaders) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    FakeApi api;
    auto client = Client::createWithTransport(std::make_unique<FakeTransport>(api));
    FakeClock clock;
    std::mt19937 rng(seed);
    api.beforeRequest = [&](const HttpRequest&) {
      clock.advance(milliseconds(rng() % 1500));  // the request takes time
      return rng() % 10 == 0 ? 500 : 0;           // and sometimes fails
    };
    std::vector<std::unique_ptr<LeaderElector>> candidates;
    std::vector<MonoTime> stalledUntil(3, clock.now());
    for (int i = 0; i < 3; ++i) {
      candidates.push_back(std::move(*LeaderElector::create(
          *client,
          {.leaseNamespace = "sys", .leaseName = "op", .identity = "c" + std::to_string(i), .clock = &clock})));
    }
    int leaderChanges = 0;
    std::string lastLeader;
    for (int step = 0; step < 600; ++step) {
      clock.advance(milliseconds(rng() % 1000));
      int i = static_cast<int>(rng() % 3);
      if (rng() % 50 == 0) stalledUntil[i] = clock.now() + seconds(rng() % 30);
      if (clock.now() >= stalledUntil[i]) (void)candidates[i]->tick();
      int leaders = 0;
      for (auto& c : candidates) {
        if (!c->isLeader()) continue;
        ++leaders;
        EXPECT_EQ(api.objects[kLeasePath]["spec"]["holderIdentity"], c->identity()) << "seed " << seed;
        if (c->identity() != lastLeader) {
          ++leaderChanges;
          lastLeader = c->identity();
        }
      }
      ASSERT_LE(leaders, 1) << "seed " << seed << " step " << step;
    }
    EXPECT_GE(leaderChanges, 1) << "seed " << seed;
  }
}

}  // namespace
}  // namespace tandem::k8s
