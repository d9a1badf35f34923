// A prefill peer's health on a FakeClock: the windowed and the in-a-row
// failure counts, heartbeats missed into suspicion and answered out of it,
// probes of an unhealthy peer, and the heartbeat cadence.

#include "agent/peer_health.h"

#include <gtest/gtest.h>

namespace tandem::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

PeerHealthOptions options(int failures = 3) {
  return {.failures = failures,
          .window = seconds(10),
          .missed_heartbeats = 3,
          .heartbeat_interval = milliseconds(500),
          .idle_heartbeat_interval = seconds(2),
          .probe_interval = seconds(1)};
}

TEST(PeerHealthTest, UnhealthyAfterNFailuresWithinTheWindow) {
  FakeClock clock;
  PeerHealth h(options(), clock);
  h.recordFailure();
  h.recordSuccess();
  h.recordFailure();
  EXPECT_TRUE(h.healthy());
  clock.advance(seconds(9));
  h.recordSuccess();
  h.recordFailure();
  EXPECT_EQ(h.state(), PeerState::kUnhealthy) << "three within ten seconds, successes between";
}

TEST(PeerHealthTest, FailuresOutsideTheWindowAreForgottenWhenSuccessesCameBetween) {
  FakeClock clock;
  PeerHealth h(options(), clock);
  h.recordFailure();
  h.recordFailure();
  h.recordSuccess();
  clock.advance(milliseconds(10001));
  h.recordFailure();
  EXPECT_TRUE(h.healthy()) << "the first two failures left the window";
  h.recordSuccess();
  h.recordFailure();
  EXPECT_TRUE(h.healthy());
  h.recordFailure();
  EXPECT_FALSE(h.healthy());
}

// A peer whose every transfer fails slowly (each after its deadline) never
// fills a ten-second window; failures in a row still count.
TEST(PeerHealthTest, SlowFailuresInARowMakeItUnhealthy) {
  FakeClock clock;
  PeerHealth h(options(), clock);
  for (int i = 0; i < 2; ++i) {
    h.recordFailure();
    clock.advance(seconds(60));
    EXPECT_TRUE(h.healthy()) << i;
  }
  h.recordFailure();
  EXPECT_EQ(h.state(), PeerState::kUnhealthy);
}

TEST(PeerHealthTest, MissedHeartbeatsInARowMakeItSuspectAndAnAnswerHealthy) {
  FakeClock clock;
  PeerHealth h(options(), clock);
  uint64_t seq = 0;
  h.heartbeatSent(++seq);
  ASSERT_TRUE(h.heartbeatAnswered(seq));
  for (int missed = 0; missed < 3; ++missed) {
    EXPECT_TRUE(h.healthy()) << missed;
    h.heartbeatSent(++seq);
    clock.advance(milliseconds(500));
  }
  h.heartbeatSent(++seq);  // the third one goes out unanswered
  EXPECT_EQ(h.numMissedHeartbeats(), 3);
  EXPECT_EQ(h.state(), PeerState::kSuspect);
  EXPECT_FALSE(h.heartbeatAnswered(seq + 7)) << "never sent";
  EXPECT_EQ(h.state(), PeerState::kSuspect);
  clock.advance(milliseconds(40));
  std::optional<Duration> rtt = h.heartbeatAnswered(seq);
  ASSERT_TRUE(rtt);
  EXPECT_EQ(*rtt, milliseconds(40));
  EXPECT_EQ(h.state(), PeerState::kHealthy);
  EXPECT_FALSE(h.heartbeatAnswered(seq)) << "answered once";
  EXPECT_FALSE(h.heartbeatAnswered(seq - 1)) << "older than an answered one";
}

// Answers that come back after the next heartbeat went out (a round trip
// longer than the interval) still count: the peer stays healthy as long as
// it answers within `missed_heartbeats` intervals.
TEST(PeerHealthTest, ASlowButAnsweringPeerStaysHealthy) {
  FakeClock clock;
  PeerHealth h(options(), clock);
  h.heartbeatSent(1);
  for (uint64_t seq = 2; seq <= 100; ++seq) {
    clock.advance(seq == 2 ? milliseconds(500) : milliseconds(300));  // heartbeats 500 ms apart
    h.heartbeatSent(seq);  // the previous one is still out: a miss
    clock.advance(milliseconds(200));
    std::optional<Duration> rtt = h.heartbeatAnswered(seq - 1);  // 700 ms after it went out
    ASSERT_TRUE(rtt) << seq;
    EXPECT_EQ(*rtt, milliseconds(700));
    ASSERT_EQ(h.state(), PeerState::kHealthy) << seq;
  }
}

// A long prefill that keeps P's engine busy does not make it suspect: the
// answers come from P's transport thread, and only unanswered heartbeats count.
TEST(PeerHealthTest, AnsweredHeartbeatsKeepABusyPeerHealthyForAnyLength) {
  FakeClock clock;
  PeerHealth h(options(), clock);
  for (uint64_t seq = 1; seq <= 600; ++seq) {  // five minutes of heartbeats
    h.heartbeatSent(seq);
    clock.advance(milliseconds(3));
    ASSERT_TRUE(h.heartbeatAnswered(seq));
    clock.advance(milliseconds(497));
  }
  EXPECT_EQ(h.state(), PeerState::kHealthy);
}

// An unhealthy peer is healthy again only on the answer to a probe sent
// after the verdict, never on a late answer to an earlier heartbeat.
TEST(PeerHealthTest, OnlyAProbeAfterTheVerdictMakesItHealthyAgain) {
  FakeClock clock;
  PeerHealth h(options(2), clock);
  h.heartbeatSent(1);
  h.recordFailure();
  h.recordFailure();
  ASSERT_EQ(h.state(), PeerState::kUnhealthy);
  EXPECT_FALSE(h.heartbeatAnswered(1)) << "sent before the verdict";
  EXPECT_EQ(h.state(), PeerState::kUnhealthy);
  clock.advance(std::chrono::hours(1));
  EXPECT_FALSE(h.healthy()) << "time alone does not heal it; a probe does";
  h.heartbeatSent(2);
  EXPECT_TRUE(h.heartbeatAnswered(2));
  EXPECT_TRUE(h.healthy());
  h.recordFailure();
  EXPECT_TRUE(h.healthy()) << "a fresh window and count";
}

TEST(PeerHealthTest, HeartbeatCadenceFollowsWorkAndState) {
  FakeClock clock;
  PeerHealth h(options(1), clock);
  const MonoTime t0 = clock.now();
  EXPECT_LE(h.nextHeartbeat(/*busy=*/false), t0) << "the first one at once";
  h.heartbeatSent(1);
  EXPECT_EQ(h.nextHeartbeat(/*busy=*/false), t0 + seconds(2));
  EXPECT_EQ(h.nextHeartbeat(/*busy=*/true), t0 + milliseconds(500));
  h.recordFailure();
  ASSERT_EQ(h.state(), PeerState::kUnhealthy);
  EXPECT_EQ(h.nextHeartbeat(/*busy=*/true), t0 + seconds(1)) << "probed every probe_interval";
  h.heartbeatSent(2);
  ASSERT_TRUE(h.heartbeatAnswered(2));
  for (uint64_t seq = 3; seq <= 6; ++seq) h.heartbeatSent(seq);
  ASSERT_EQ(h.state(), PeerState::kSuspect);
  EXPECT_EQ(h.nextHeartbeat(/*busy=*/false), t0 + milliseconds(500)) << "a suspect peer is pinged at the busy rate";
}

TEST(PeerHealthTest, StateNames) {
  EXPECT_EQ(peerStateName(PeerState::kHealthy), "healthy");
  EXPECT_EQ(peerStateName(PeerState::kSuspect), "suspect");
  EXPECT_EQ(peerStateName(PeerState::kUnhealthy), "unhealthy");
}

}  // namespace
}  // namespace tandem::agent
